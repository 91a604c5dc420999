"""How often a waiting ``capture --nodes`` node looks for the merge (``manifest/nodes/gather.py``).

A node that finishes first used to look every 0.5 s, so it found the merge up
to 0.5 s after the last node wrote it (~4% of a 13 s two-node job). Now each
wait is a tenth of the time waited so far. The sleeps of a real waiting node
(a thread standing in for node 0) are recorded, not replaced.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from manifest.nodes.gather import POLL_MIN_S, POLL_S, gather, poll_interval, record_name
from tests.test_nodes import node_record


def test_the_wait_grows_with_the_time_waited_between_its_bounds() -> None:
    assert poll_interval(0.0) == POLL_MIN_S
    assert poll_interval(1.0) == pytest.approx(0.1)
    assert poll_interval(2.0) == pytest.approx(0.2)
    assert poll_interval(5.0) == POLL_S
    assert poll_interval(3600.0) == POLL_S


def test_a_node_that_finished_first_looks_often_while_the_other_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = time.sleep

    def recorded(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded)  # what gather's loop calls
    out: dict[str, Any] = {}

    def node_0() -> None:
        out["result"] = gather(node_record(0), tmp_path, timeout_s=120)

    thread = threading.Thread(target=node_0)
    thread.start()
    deadline = time.monotonic() + 120
    while len(slept) < 20:  # node 0 is waiting and has looked 20 times
        assert time.monotonic() < deadline and thread.is_alive()
        real_sleep(0.01)
    done = gather(node_record(1), tmp_path, timeout_s=60)
    thread.join()
    assert done.merged_here and out["result"].run_id == done.run_id
    assert (tmp_path / record_name(0)).is_file()
    # Positive control: the old schedule slept POLL_S (0.5 s) before every look.
    assert slept[0] == POLL_MIN_S < POLL_S
    assert slept == sorted(slept)  # waits only grow while the node waits
    assert len(set(slept)) > 1
