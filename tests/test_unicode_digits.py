"""A digit that is not a decimal digit ('²', '①') is not a number to the code that reads
launcher variables, pids and table versions: str.isdigit() accepts it and int() then
raised ValueError (a traceback); these read it as absent or refuse it in one sentence."""

from __future__ import annotations

import pytest

from manifest.errors import DataError
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.launch.runner import restart_of, select_ranks
from manifest.nodes.topology import _first_int


@pytest.mark.parametrize("value", ["²", "①", "3²"])
def test_a_superscript_rank_is_no_rank(value: str) -> None:
    records: list[ProcessRecord] = [
        {"pid": 1, "start_ns": 1, "launch_env": {"SLURM_PROCID": value}},
        {"pid": 2, "start_ns": 2, "launch_env": {"SLURM_PROCID": "0"}}]
    assert [r["rank"] for r in select_ranks(records)] == [0]  # only the decimal one ranks
    assert restart_of({"pid": 1, "launch_env": {"TORCHELASTIC_RESTART_COUNT": value}}) == 0
    assert _first_int({"WORLD_SIZE": value}, ("WORLD_SIZE",)) is None


def test_decimal_values_still_count() -> None:
    """The control: ASCII (and other decimal) digits are read as before."""
    records: list[ProcessRecord] = [{"pid": 1, "launch_env": {"SLURM_PROCID": "1"}},
               {"pid": 2, "launch_env": {"SLURM_PROCID": "0"}}]
    assert [r["rank"] for r in select_ranks(records)] == [0, 1]
    assert restart_of({"pid": 1, "launch_env": {"TORCHELASTIC_RESTART_COUNT": "2"}}) == 2
    assert _first_int({"WORLD_SIZE": " 4 "}, ("WORLD_SIZE",)) == 4


def test_a_superscript_table_version_is_refused_in_one_sentence() -> None:
    from manifest.data.remote.url import parse_url

    with pytest.raises(DataError, match="invalid table version"):
        parse_url("delta:///tables/t@²")
    assert parse_url("delta:///tables/t@3").revision == "3"
