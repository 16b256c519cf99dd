"""The warehouse benchmark's synthetic night is coherent and its measurement runs end to end."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc

from bench.warehouse_load import Shape, main, make_run, measure, target_seconds
from warehouse.run_files import read_table

SMALL = Shape(requests=3_000, gaps_per_request=4, hours=0.5, seed=3)


def test_synthetic_run_is_self_consistent(tmp_path: Path) -> None:
    directory = make_run(tmp_path, "b", SMALL)
    requests = read_table(directory, "requests")
    gaps = read_table(directory, "token_gaps")
    assert requests.num_rows == SMALL.requests
    # every request streams output_tokens - 1 gaps, and its last gap lands on its t_end
    assert gaps.num_rows == pc.sum(requests.column("output_tokens")).as_py() - SMALL.requests
    last = gaps.group_by("request_id").aggregate([("t", "max")]).sort_by("request_id")
    ends = requests.sort_by("request_id").column("t_end").to_pylist()
    assert last.column("t_max").to_pylist() == ends
    assert 3.5 < gaps.num_rows / SMALL.requests < 4.5
    docs = read_table(directory, "documents")
    assert (
        pc.sum(docs.column("sections")).as_py()
        == pc.sum(pc.equal(requests.column("class"), "batch")).as_py()
    )


def test_measure_times_load_views_and_reload(tmp_path: Path) -> None:
    timings = measure(tmp_path, make_run(tmp_path, "b", SMALL))
    assert {"load (rows + rollups)", "view slo_windows", "view cost", "reload (replaces)"} <= set(
        timings
    )
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in timings.values())
    assert target_seconds(timings) < sum(wall for wall, _ in timings.values())


def test_main_prints_the_verdict(capsys) -> None:
    assert main(["--requests", "2000", "--gaps-per-request", "2", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "requests 2,000" in out and "target < 5 s wall: met" in out
