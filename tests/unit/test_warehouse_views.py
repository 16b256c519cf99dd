"""Every warehouse view on a small run whose latencies are known, so each figure is asserted exactly.

The run: 30 s, three 10 s windows, SLO ITL p99 50 ms / TTFT p99 200 ms.
window 0: chat fine                      -> SLO met;   batch b1 (1003 tokens), document d1 done
window 1: chat gaps of 100 ms            -> ITL breach; batch b2 (2002 tokens), document d2 done
window 2: a chat request fails           -> breach;     batch b3 (5003 tokens), d3 done; b4 fails
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.records import RequestRecord
from warehouse.db import connect, db_path
from warehouse.load import load_results
from warehouse.queries import VIEWS, rows, view
from warehouse.run_files import RunMeta, run_dir, write_meta, write_table

RUN = "sample"
ENGINE_RUN = "sample-engine"
T0 = 1000.0


def request(rid, cls, stage, replica, submit, tokens, end, prompt, doc=None, cached=0, ok=True):
    r = RequestRecord(
        RUN,
        rid,
        cls,
        stage,
        replica,
        doc_id=doc,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=len(tokens),
        t_submit=T0 + submit,
    )
    r.finish([T0 + t for t in tokens], T0 + end)
    if not ok:
        r.status, r.error = "error", "connection reset"
    return r


def sample_requests() -> list[RequestRecord]:
    return [
        request("c1", "chat", "chat", "r0", 0.0, [0.1, 0.12, 0.14, 0.16], 0.16, 100),
        request("c2", "chat", "chat", "r1", 1.0, [1.15, 1.18, 1.21], 1.21, 100),
        request("b1", "batch", "map", "r0", 2.0, [3.0, 3.5, 4.0], 4.0, 1000, doc="d1", cached=100),
        request("c3", "chat", "chat", "r0", 11.0, [11.1, 11.2, 11.3], 11.3, 50),
        request("b2", "batch", "whole", "r1", 12.0, [13.0, 14.0], 14.0, 2000, doc="d2"),
        request("c4", "chat", "chat", "r1", 21.0, [], 21.5, 60, ok=False),
        request("c5", "chat", "chat", "r0", 22.0, [22.05, 22.06], 22.06, 80),
        request("b3", "batch", "whole", "r0", 20.0, [21.0, 21.2, 21.4], 21.4, 5000, doc="d3"),
        request("b4", "batch", "whole", "r1", 23.0, [], 24.0, 700, doc="d4", ok=False),
    ]


def write_sample_run(results: Path, run_id: str = RUN, **meta_fields) -> list[RequestRecord]:
    """Write the sample run (optionally under another id / SLO) and return its request records."""
    records = sample_requests()
    for r in records:
        r.run_id = run_id
    directory = run_dir(results, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    write_table(directory, "requests", [r.row() for r in records])
    gaps = [
        {"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t}
        for r in records
        for g in r.gaps
    ]
    write_table(directory, "token_gaps", gaps, run_id=run_id)
    write_table(
        directory,
        "documents",
        [
            {
                "doc_id": "d1",
                "status": "done",
                "prompt_tokens": 1000,
                "sections": 1,
                "t_done": T0 + 4.5,
            },
            {
                "doc_id": "d2",
                "status": "done",
                "prompt_tokens": 2000,
                "sections": 1,
                "t_done": T0 + 14.5,
            },
            {
                "doc_id": "d3",
                "status": "done",
                "prompt_tokens": 5000,
                "sections": 1,
                "t_done": T0 + 21.5,
            },
            {"doc_id": "d4", "status": "failed", "reason": "request failed", "prompt_tokens": 700},
            {"doc_id": "d5", "status": "skipped", "reason": "empty document"},
        ],
        run_id=run_id,
    )
    write_table(
        directory,
        "summaries",
        [
            {
                "doc_id": d,
                "summary": f"summary of {d}",
                "summary_tokens": 3,
                "sections": 1,
                "replicas": [rep],
            }
            for d, rep in (("d1", "r0"), ("d2", "r1"), ("d3", "r0"))
        ],
        run_id=run_id,
    )
    write_table(
        directory,
        "decisions",
        [
            {
                "t": T0,
                "replica": "r0",
                "batch_seats": 4,
                "chunk_tokens": 2048,
                "reason": "cold-start",
            },
            {
                "t": T0 + 10,
                "replica": "r0",
                "batch_seats": 2,
                "chunk_tokens": 1024,
                "reason": "cut",
            },
            {
                "t": T0 + 20,
                "replica": "r0",
                "batch_seats": 1,
                "chunk_tokens": 512,
                "reason": "hold",
            },
            {
                "t": T0,
                "replica": "r1",
                "batch_seats": 4,
                "chunk_tokens": 2048,
                "reason": "cold-start",
            },
            {
                "t": T0 + 20,
                "replica": "r1",
                "batch_seats": 0,
                "chunk_tokens": 512,
                "pause": True,
                "reason": "cut",
            },
        ],
        run_id=run_id,
    )
    slo = {"chat_itl_p99_ms": 50.0, "chat_ttft_p99_ms": 200.0, "window_s": 10.0}
    slo.update(meta_fields.pop("slo", {}))
    fields = dict(engine_config="cpu-tiny", policy="slo", hardware_count=4, hourly_usd=36.0)
    fields.update(started=T0, ended=T0 + 30.0, corpus_path="corpus.parquet", **meta_fields)
    meta = RunMeta(run_id, slo=slo, **fields)
    write_meta(directory, meta)
    return records


def ms_percentiles(values: list[float]) -> list[float]:
    """The oracle: numpy's linear percentiles, in ms."""
    return [float(np.percentile(values, q)) * 1000 for q in (50, 95, 99)]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    records = write_sample_run(results)
    write_sample_run(results, "sample-e2e", slo={"chat_e2e_p99_ms": 100.0})
    write_engine_run(results, ENGINE_RUN)
    load_results(results)
    load_results(results)  # twice: a reload must replace, never duplicate
    con = connect(db_path(results), read_only=True)
    yield con, {r.request_id: r for r in records}
    con.close()


def view_rows(con, name: str, run_id: str = RUN) -> list[dict]:
    return [r for r in view(con, name).to_pylist() if r["run_id"] == run_id]


def test_every_view_answers(warehouse) -> None:
    con, _ = warehouse
    for name in VIEWS:
        assert view(con, name).num_rows > 0, name


def test_class_latency_is_exact_and_itl_token_weighted(warehouse) -> None:
    con, rec = warehouse
    by_class = {r["class"]: r for r in view_rows(con, "class_latency")}
    chat = [r for r in rec.values() if r.cls == "chat"]
    c = by_class["chat"]
    assert (c["requests"], c["failed"], c["token_gaps"]) == (5, 1, 8)
    ttft = ms_percentiles([r.ttft_s for r in chat if r.ttft_s is not None])
    itl = ms_percentiles([g.gap_s for r in chat for g in r.gaps])
    e2e = ms_percentiles([r.e2e_s for r in chat if r.status == "ok"])
    got = lambda m: [c[f"{m}_{q}_ms"] for q in ("p50", "p95", "p99")]  # noqa: E731
    assert got("ttft") == pytest.approx(ttft)
    assert got("itl") == pytest.approx(itl)
    assert got("e2e") == pytest.approx(e2e)
    assert c["ttft_p50_ms"] == pytest.approx(100.0)  # sorted TTFTs 50, 100, 100, 150 ms
    b = by_class["batch"]
    assert (b["requests"], b["failed"], b["token_gaps"]) == (4, 1, 5)
    assert b["e2e_p50_ms"] == pytest.approx(2000.0)  # ok batch E2E 2.0, 2.0, 1.4 s


def test_slo_windows_percentiles_and_verdicts(warehouse) -> None:
    con, rec = warehouse
    windows = sorted(view_rows(con, "slo_windows"), key=lambda r: (r["window_idx"], r["class"]))
    assert [(r["window_idx"], r["class"]) for r in windows] == [
        (0, "batch"),
        (0, "chat"),
        (1, "batch"),
        (1, "chat"),
        (2, "batch"),
        (2, "chat"),
    ]
    chat = {r["window_idx"]: r for r in windows if r["class"] == "chat"}
    # window 0: token-weighted ITL over c1's three 20 ms gaps and c2's two 30 ms gaps
    assert chat[0]["itl_p50_ms"] == pytest.approx(20.0)  # a per-request average would say 25
    assert chat[0]["itl_p99_ms"] == pytest.approx(30.0)
    assert chat[0]["ttft_p99_ms"] == pytest.approx(
        ms_percentiles([rec["c1"].ttft_s, rec["c2"].ttft_s])[2]
    )
    assert chat[1]["itl_p99_ms"] == pytest.approx(100.0)
    assert (chat[2]["requests"], chat[2]["failed"]) == (2, 1)
    assert chat[2]["ttft_p99_ms"] == pytest.approx(50.0)  # the failed request had no first token
    assert [chat[w]["slo_met"] for w in range(3)] == [True, False, False]
    # the verdict is the window's, repeated on its batch row
    assert [r["slo_met"] for r in windows if r["class"] == "batch"] == [True, False, False]
    batch2 = next(r for r in windows if r["class"] == "batch" and r["window_idx"] == 2)
    assert (batch2["requests"], batch2["failed"], batch2["processed_tokens"]) == (2, 1, 5003)
    assert [r["t_rel_s"] for r in windows[::2]] == [0.0, 10.0, 20.0]


def test_e2e_slo_breaks_windows_when_set(warehouse) -> None:
    con, _ = warehouse
    chat = sorted(
        (r for r in view_rows(con, "slo_windows", "sample-e2e") if r["class"] == "chat"),
        key=lambda r: r["window_idx"],
    )
    # chat E2E p99: window 0 ~209 ms, window 1 300 ms > 100 ms; window 2 failed anyway
    assert [r["slo_met"] for r in chat] == [False, False, False]


def test_run_windows_and_batch_goodput(warehouse) -> None:
    con, _ = warehouse
    windows = sorted(view_rows(con, "run_windows"), key=lambda r: r["window_idx"])
    assert [r["batch_tokens"] for r in windows] == [1003, 2002, 5003]
    assert [r["batch_tokens_per_s"] for r in windows] == pytest.approx([100.3, 200.2, 500.3])
    assert [r["documents_done"] for r in windows] == [1, 1, 1]
    assert [r["window_len_s"] for r in windows] == [10.0, 10.0, 10.0]
    (g,) = view_rows(con, "batch_goodput")
    assert (g["windows"], g["windows_met"]) == (3, 1)
    assert g["slo_attainment"] == pytest.approx(1 / 3)
    assert (g["batch_tokens"], g["good_batch_tokens"]) == (8008, 1003)
    assert g["batch_tokens_per_s"] == pytest.approx(8008 / 30)
    assert g["slo_batch_tokens_per_s"] == pytest.approx(1003 / 30)
    assert g["documents_per_hour"] == pytest.approx(360.0)
    assert g["goodput_documents_per_hour"] == pytest.approx(120.0)


def test_cost(warehouse) -> None:
    con, _ = warehouse
    (c,) = view_rows(con, "cost")
    assert (c["replicas"], c["devices"]) == (2, 8)  # replicas counted from requests, 4 devices each
    assert c["cost_usd"] == pytest.approx(36.0 * 2 * 30 / 3600)
    assert c["usd_per_1m_batch_tokens"] == pytest.approx(0.6 * 1e6 / 8008)
    assert c["usd_per_document"] == pytest.approx(0.2)


def test_run_summary(warehouse) -> None:
    con, _ = warehouse
    (s,) = view_rows(con, "run_summary")
    assert (s["documents"], s["documents_done"], s["documents_failed"], s["documents_skipped"]) == (
        5,
        3,
        1,
        1,
    )
    assert (s["chat_requests"], s["batch_requests"], s["failed_requests"]) == (5, 4, 2)
    assert (s["batch_tokens"], s["batch_cached_tokens"], s["replicas"]) == (8008, 100, 2)
    assert (s["decisions"], s["windows"], s["duration_s"]) == (5, 3, 30.0)
    assert (s["engine_config"], s["policy"], s["slo_ttft_p99_ms"]) == ("cpu-tiny", "slo", 200.0)


def test_report_queries(warehouse) -> None:
    con, _ = warehouse
    caps = rows(con, "report_caps", run_id=RUN)
    assert [(c["replica"], c["t_rel_s"], c["batch_seats"], c["pause"]) for c in caps] == [
        ("r0", 0.0, 4, False),
        ("r0", 10.0, 2, False),
        ("r0", 20.0, 1, False),
        ("r1", 0.0, 4, False),
        ("r1", 20.0, 0, True),
    ]
    assert [r["window_idx"] for r in rows(con, "report_windows", run_id=RUN)] == [0, 1, 2]
    assert [r["class"] for r in rows(con, "report_latency", run_id=RUN)] == ["chat", "batch"]
    assert rows(con, "latest_run")[0]["run_id"] in {RUN, "sample-e2e", ENGINE_RUN}


def test_times_outside_the_run_fall_into_its_first_and_last_window(tmp_path) -> None:
    early = request("early", "chat", "chat", "r0", -5.0, [-4.9, -4.8], -4.8, 10)
    late = request("late", "chat", "chat", "r0", 28.0, [29.0, 31.0, 33.0], 33.0, 10)
    directory = run_dir(tmp_path, RUN)
    directory.mkdir(parents=True)
    write_table(directory, "requests", [early.row(), late.row()])
    gaps = [
        {"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t}
        for r in (early, late)
        for g in r.gaps
    ]
    write_table(directory, "token_gaps", gaps, run_id=RUN)
    write_meta(directory, RunMeta(RUN, slo={"window_s": 10.0}, started=T0, ended=T0 + 30.0))
    load_results(tmp_path)
    con = connect(db_path(tmp_path), read_only=True)
    chat = sorted(
        (r for r in view(con, "slo_windows").to_pylist() if r["class"] == "chat"),
        key=lambda r: r["window_idx"],
    )
    con.close()
    assert [(r["window_idx"], r["requests"], r["token_gaps"]) for r in chat] == [
        (0, 1, 1),
        (1, 0, 0),
        (2, 1, 2),
    ]


def engine_series():
    """r0 and r1 scraped at each window's end: window 0 all fast, window 1 fast but for 5% in
    (10, 50] ms, window 2 a fifth in (50, 200] ms."""
    from serving.engine_itl import HistogramSeries
    from serving.metrics import Histogram

    bounds = (0.01, 0.05, 0.2, float("inf"))

    def cum(*per_bucket: int) -> Histogram:
        totals = np.cumsum(per_bucket).astype(float)
        return Histogram(bounds, tuple(totals), float(totals[-1]), 0.0)

    series = HistogramSeries()
    for replica in ("r0", "r1"):
        series.add(replica, T0 - 0.5, cum(0, 0, 0, 0))
        series.add(replica, T0 + 9.5, cum(200, 0, 0, 0))
        series.add(replica, T0 + 19.5, cum(390, 10, 0, 0))
        series.add(replica, T0 + 29.5, cum(390, 10, 100, 0))
    return series


def write_engine_run(results: Path, run_id: str):
    write_sample_run(results, run_id)
    series = engine_series()
    write_table(run_dir(results, run_id), "engine_itl", series.rows(run_id), run_id=run_id)
    return series


def test_engine_itl_judges_chat_windows_where_recorded(warehouse) -> None:
    con, _ = warehouse
    series = engine_series()
    chat = {
        r["window_idx"]: r
        for r in view_rows(con, "slo_windows", ENGINE_RUN)
        if r["class"] == "chat"
    }
    engine = {r["window_idx"]: r for r in view_rows(con, "engine_windows", ENGINE_RUN)}
    spans = [(T0 - 0.5, T0 + 9.5), (T0 + 9.5, T0 + 19.5), (T0 + 19.5, T0 + 29.5)]
    for w, (a, b) in enumerate(spans):
        assert engine[w]["itl_p99_ms"] == pytest.approx(series.quantile_ms(a, b, 0.99)), w
        assert chat[w]["itl_source"] == "engine"
        assert chat[w]["itl_p99_ms"] == pytest.approx(engine[w]["itl_p99_ms"])
    assert engine[0]["itl_observations"] == 400
    # window 1: the client saw 100 ms gaps, the engine 5% of steps in (10, 50] ms: held
    assert chat[1]["client_itl_p99_ms"] == pytest.approx(100.0)
    assert [chat[w]["slo_met"] for w in range(3)] == [True, True, False]
    # a run without the histogram is judged by its streamed gaps
    plain = [r for r in view_rows(con, "slo_windows") if r["class"] == "chat"]
    assert {r["itl_source"] for r in plain} == {"client"}


def test_a_night_without_chat_requests_judges_chat_ttft_by_the_engine(tmp_path) -> None:
    """In production the night holds no chat request: its windows take chat TTFT from the
    plug-in's chat-only histogram, and a slow one breaks the SLO (200 ms here)."""
    from serving.engine_itl import HistogramSeries
    from serving.metrics import Histogram

    run_id = "sample-prod"
    records = write_sample_run(tmp_path, run_id)
    batch = [r for r in records if r.cls == "batch"]
    directory = run_dir(tmp_path, run_id)
    write_table(directory, "requests", [r.row() for r in batch], run_id=run_id)
    gaps = [{"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t} for r in batch
            for g in r.gaps]  # fmt: skip
    write_table(directory, "token_gaps", gaps, run_id=run_id)

    def series(*windows: tuple[int, ...]) -> HistogramSeries:
        bounds = (0.01, 0.1, 1.0, float("inf"))
        s, total = HistogramSeries(), np.zeros(4)
        s.add("r0", T0 - 0.5, Histogram(bounds, (0.0,) * 4, 0.0, 0.0))
        for w, counts in enumerate(windows):
            total = total + np.cumsum(counts)
            s.add("r0", T0 + 9.5 + 10 * w, Histogram(bounds, tuple(total), total[-1], 0.0))
        return s

    itl = series((100, 0, 0, 0), (100, 0, 0, 0), (100, 0, 0, 0))  # every gap under 10 ms
    ttft = series((0, 20, 0, 0), (0, 20, 0, 0), (0, 16, 4, 0))  # a fifth over 100 ms in w2
    write_table(directory, "engine_itl", itl.rows(run_id), run_id=run_id)
    write_table(directory, "engine_ttft", ttft.rows(run_id), run_id=run_id)
    load_results(tmp_path)
    con = connect(db_path(tmp_path), read_only=True)
    chat = sorted(
        (r for r in view_rows(con, "slo_windows", run_id) if r["class"] == "chat"),
        key=lambda r: r["window_idx"],
    )
    con.close()
    assert [r["requests"] for r in chat] == [0, 0, 0]
    assert {(r["ttft_source"], r["itl_source"]) for r in chat} == {("engine", "engine")}
    spans = [(T0 - 0.5, T0 + 9.5), (T0 + 9.5, T0 + 19.5), (T0 + 19.5, T0 + 29.5)]
    for r, (a, b) in zip(chat, spans, strict=True):
        assert r["ttft_p99_ms"] == pytest.approx(ttft.quantile_ms(a, b, 0.99))
    assert chat[0]["ttft_p99_ms"] <= 100.0 < chat[2]["ttft_p99_ms"]
    assert [r["slo_met"] for r in chat] == [True, True, False]


def test_a_run_with_chat_requests_keeps_their_ttft(warehouse) -> None:
    con, _ = warehouse
    chat = [r for r in view_rows(con, "slo_windows") if r["class"] == "chat"]
    assert chat and {r["ttft_source"] for r in chat} == {"client"}
