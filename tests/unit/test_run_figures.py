"""The demo's figures of a run, read from the warehouse on the sample run whose rows are known
(tests/unit/test_warehouse_views.py): chat's windows in order, and each document's requests."""

from __future__ import annotations

from tests.unit.test_warehouse_views import RUN, write_sample_run
from warehouse.load import load_results
from warehouse.run_figures import run_figures


def test_windows_and_documents_of_the_sample_run(tmp_path) -> None:
    write_sample_run(tmp_path)
    load_results(tmp_path)
    figures = run_figures(tmp_path, RUN)

    assert [(w["window_idx"], w["requests"], w["slo_met"]) for w in figures.windows] == [
        (0, 2, True),
        (1, 1, False),
        (2, 2, False),
    ]
    docs = {d["doc_id"]: d for d in figures.documents}
    assert list(docs) == ["d1", "d2", "d3", "d4", "d5"]
    assert [
        (d["requests"], d["request_prompt_tokens"], d["cached_tokens"], d["stages"])
        for d in (docs["d1"], docs["d2"], docs["d3"])
    ] == [(1, 1000, 100, "map"), (1, 2000, 0, "whole"), (1, 5000, 0, "whole")]
    # d4's one request failed: it counts no request and no tokens, and keeps its reason.
    assert docs["d4"]["requests"] == 0 and docs["d4"]["stages"] is None
    assert (docs["d4"]["status"], docs["d4"]["reason"]) == ("failed", "request failed")
    assert docs["d4"]["doc_tokens"] == 700
