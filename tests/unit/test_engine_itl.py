"""The engine-side ITL series: window quantiles from scraped cumulative histograms."""

import pytest

from bench.scoring import chat_latency, window_verdicts
from scheduler.records import RequestRecord
from scheduler.slo import SLO
from serving.engine_itl import HistogramSeries, itl_histogram
from serving.metrics import Histogram

BOUNDS = (0.01, 0.05, 0.2, float("inf"))


def cum(*per_bucket: int) -> Histogram:
    """A cumulative histogram from per-bucket counts."""
    total, out = 0, []
    for c in per_bucket:
        total += c
        out.append(float(total))
    return Histogram(BOUNDS, tuple(out), float(total), 0.0)


def series() -> HistogramSeries:
    s = HistogramSeries()
    s.add("a", 0.0, cum(0, 0, 0, 0))
    s.add("a", 10.0, cum(100, 0, 0, 0))  # window [0, 10): all fast
    s.add("a", 20.0, cum(100, 0, 100, 0))  # window [10, 20): half at 50-200 ms
    return s


def test_window_is_the_difference_between_scrapes_at_its_ends() -> None:
    s = series()
    assert s.window(0, 10).count == 100
    assert s.quantile_ms(0, 10, 0.99) <= 10.0
    assert 50.0 < s.quantile_ms(10, 20, 0.99) <= 200.0
    assert s.window(0, 20).count == 200


def test_replicas_add_up() -> None:
    s = series()
    s.add("b", 0.0, cum(0, 0, 0, 0))
    s.add("b", 10.0, cum(0, 0, 300, 0))
    assert s.window(0, 10).count == 400
    assert s.quantile_ms(0, 10, 0.5) > 50.0  # b's slow tokens dominate


def test_replicas_with_different_buckets_are_refused() -> None:
    s = series()
    s.add("b", 0.0, Histogram((0.1, float("inf")), (0.0, 0.0), 0.0, 0.0))
    s.add("b", 10.0, Histogram((0.1, float("inf")), (5.0, 5.0), 5.0, 0.0))
    with pytest.raises(ValueError, match="same engine config"):
        s.window(0, 10)


def test_engine_itl_judges_windows_and_is_reported_beside_client_gaps() -> None:
    slo = SLO(chat_itl_p99_ms=60, chat_ttft_p99_ms=500, window_s=10)
    r = RequestRecord("r", "c", "chat", "chat", "a", t_submit=1.0)
    times = [1.1 + 0.5 * i for i in range(30)]  # client saw 500 ms bursts in both windows
    r.finish(times, times[-1])
    s = series()
    assert window_verdicts([r], 0, 20, slo) == [False, False]
    judged = window_verdicts([r], 0, 20, slo, engine_itl=lambda a, b: s.quantile_ms(a, b, 0.99))
    assert judged == [True, False]
    lat = chat_latency([r], s.quantiles_ms(0, 20))
    assert lat["itl_source"] == "engine" and lat["client_itl_ms"]["p99"] == pytest.approx(500.0)


def test_itl_histogram_reads_either_metric_name() -> None:
    text = (
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_bucket{le="0.01"} 3\n'
        'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 4\n'
        "vllm:inter_token_latency_seconds_count 4\n"
        "vllm:inter_token_latency_seconds_sum 0.2\n"
    )
    h = itl_histogram(text)
    assert h is not None and h.count == 4 and h.cumulative == (3.0, 4.0)
    assert itl_histogram("# nothing here\n") is None


def test_a_replica_with_the_plugin_is_judged_by_chats_own_gaps_for_the_whole_run(tmp_path):
    import json

    import httpx

    from serving.engine_control import ControlTarget
    from serving.engine_itl import EngineItlRecorder

    status = {"chat_itl_seconds": {"bounds": [0.01, 0.05], "cumulative": [3, 7, 8],
                                   "count": 8, "sum": 0.2}}  # fmt: skip
    (tmp_path / "status.json").write_text(json.dumps(status))
    recorder = EngineItlRecorder(
        [("r0", "http://127.0.0.1:9")],
        plugin_status={"r0": ControlTarget("r0", folder=tmp_path)},
    )
    with httpx.Client() as client:
        _, h = recorder._scrape(client, "r0", "http://127.0.0.1:9")
        assert recorder.sources == {"r0": "plugin"}
        assert h.cumulative == (3, 7, 8) and h.bounds[-1] == float("inf")
        (tmp_path / "status.json").unlink()
        # No switch to vLLM's class-blind histogram mid-run: a missed scrape is skipped.
        assert recorder._scrape(client, "r0", "http://127.0.0.1:9") is None
        assert recorder.sources == {"r0": "plugin"}


def test_the_plugins_chat_ttft_is_recorded_beside_its_gaps(tmp_path):
    import json

    import httpx

    from serving.engine_control import ControlTarget
    from serving.engine_itl import EngineItlRecorder

    def histogram(counts):
        return {"bounds": [0.1, 1.0], "cumulative": counts, "count": counts[-1], "sum": 1.0}

    status = {"chat_itl_seconds": histogram([5, 6, 6]), "chat_ttft_seconds": histogram([2, 3, 3])}
    (tmp_path / "status.json").write_text(json.dumps(status))
    recorder = EngineItlRecorder(
        [("r0", "http://127.0.0.1:9")],
        plugin_status={"r0": ControlTarget("r0", folder=tmp_path)},
    )
    with httpx.Client() as client:
        recorder._scrape(client, "r0", "http://127.0.0.1:9")
        status["chat_ttft_seconds"] = histogram([2, 7, 7])
        (tmp_path / "status.json").write_text(json.dumps(status))
        recorder._scrape(client, "r0", "http://127.0.0.1:9")
    rows = recorder.ttft.rows("night")
    assert [(r["le_low"], r["le"], r["count"]) for r in rows] == [(0.1, 1.0, 4)]
    assert {r["run_id"] for r in rows} == {"night"}


def test_a_window_starts_from_the_last_status_written_before_it_not_the_last_read(tmp_path):
    """The plug-in writes nothing while its engine is idle, so a status read at a scenario's
    start may be seconds old: the previous scenario's last gaps must not land in the new
    scenario's first window. Samples are stamped with the document's `written_at`."""
    import json

    from serving.engine_control import ControlTarget
    from serving.engine_itl import EngineItlRecorder

    def write(at: float, cumulative: list[int]) -> None:
        doc = {"written_at": at, "chat_itl_seconds": {"bounds": [0.01, 0.05],
               "cumulative": cumulative, "count": cumulative[-1], "sum": 0.0}}  # fmt: skip
        (tmp_path / "status.json").write_text(json.dumps(doc))

    recorder = EngineItlRecorder(
        [("r0", "http://127.0.0.1:9")], plugin_status={"r0": ControlTarget("r0", folder=tmp_path)}
    )
    write(100.0, [0, 0, 10])  # the previous scenario drained at t=100 with 10 slow gaps
    recorder._scrape_all()
    write(110.0, [20, 20, 30])  # the next one, starting at t=105, made 20 fast gaps
    recorder._scrape_all()
    window = recorder.series.window(105.0, 111.0)
    assert window.cumulative == (20, 20, 20)  # none of the slow gaps from before t=105
