"""``ray start`` for the tests' extra raylets, with more than Ray's fixed 30 s to register.

``ray._private.node.Node`` gives a starting raylet a hard-coded 30 s to appear in the GCS and
then exits ("The current node timed out during startup"). On this shared 2-core machine at a
load of 10 that was never enough for a second raylet (7 restarts in a row). Here
``services.get_node``, which that loop polls, waits up to 5 minutes itself before giving up,
and then ``ray start`` runs as usual: ``python -m tests.ray_node start --block …``.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main() -> int:
    from ray._private import services
    from ray.scripts.scripts import main as ray_main

    original = services.get_node

    def patient(gcs_address: str, node_id: str) -> Any:
        deadline = time.monotonic() + 300
        while True:
            try:
                return original(gcs_address, node_id)  # type: ignore[no-untyped-call]
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient  # node.py calls it as ray._private.services.get_node
    sys.argv = ["ray", *sys.argv[1:]]
    result: int = ray_main()  # type: ignore[no-untyped-call]
    return result


if __name__ == "__main__":
    raise SystemExit(main())
