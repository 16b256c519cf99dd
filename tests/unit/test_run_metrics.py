import httpx
from prometheus_client import generate_latest

from pipelines.progress import Throughput, describe_caps
from pipelines.run_metrics import RunMetrics


def test_metrics_are_served_per_class() -> None:
    m = RunMetrics("r1")
    port = m.serve(0)
    m.remaining.set(3)
    m.observe_request({"class": "chat", "ttft_s": 0.2}, [0.01, 0.02])
    m.observe_request({"class": "batch", "ttft_s": 4.0}, [0.05])
    m.document_done("done", 1200)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'nightshift_request_itl_seconds_count{class="chat"} 2.0' in text
    assert 'nightshift_request_ttft_seconds_count{class="batch"} 1.0' in text
    assert 'nightshift_batch_documents_total{status="done"} 1.0' in text
    assert "nightshift_batch_tokens_total 1200.0" in text
    assert "nightshift_batch_documents_remaining 2.0" in text


def test_throughput_and_eta() -> None:
    t = Throughput(total_docs=4, started=100.0)
    assert t.eta_s(100.0) is None
    t.add(1000, 110.0)
    assert t.tokens_per_s(110.0) == 100.0
    assert t.eta_s(110.0) == 30.0


def test_caps_description() -> None:
    caps = {
        "b": {"batch_seats": 2, "batch_step_target_ms": 24.6, "pause": False},
        "a": {"batch_seats": 0, "pause": True},
        "c": {"reason": "down", "pause": True},
        "d": {"batch_seats": 4, "batch_step_target_ms": None, "pause": False},
    }
    assert describe_caps(caps) == "a paused, b 2 seats at 25 ms, c down, d 4 seats"


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_gate_series_are_relayed_onto_the_run_port_with_chat_histograms() -> None:
    from pipelines.gate_metrics import GateMetrics
    from scheduler.admission import Decision, Observation
    from scheduler.slo import SLO

    gate = GateMetrics()
    gate.set_slo(SLO(chat_itl_p99_ms=40, chat_ttft_p99_ms=800, chat_e2e_p99_ms=9000))
    seen = Observation(t=5.0, replica="r0", chat_e2e_p99_s=7.5)
    gate.record(seen, Decision(3, 0, reason="grow"), 1)
    histogram = {"bounds": [0.01, 0.05], "cumulative": [2, 5, 6], "count": 6, "sum": 0.3}
    keys = ("chat_itl_seconds", "chat_ttft_seconds", "chat_e2e_seconds", "chat_answer_tokens")
    gate.record_status("r0", dict.fromkeys(keys, histogram))
    run = RunMetrics("r1")
    port = run.serve(0)
    try:
        run.relay(gate.exposition)
        text = scrape(port)
        assert 'nightshift_batch_seats{replica="r0"} 3.0' in text
        assert 'nightshift_decisions_total{reason="grow"} 1.0' in text
        assert 'nightshift_chat_itl_seconds_bucket{le="0.05",replica="r0"} 5.0' in text
        assert 'nightshift_chat_ttft_seconds_count{replica="r0"} 6.0' in text
        assert "nightshift_slo_chat_itl_p99_seconds 0.04" in text
        assert 'nightshift_chat_e2e_seconds_count{replica="r0"} 6.0' in text
        assert 'nightshift_chat_answer_tokens_count{replica="r0"} 6.0' in text
        assert 'nightshift_chat_e2e_p99_seconds{replica="r0"} 7.5' in text
        assert "nightshift_slo_chat_e2e_p99_seconds 9.0" in text
        run.relay(lambda: (_ for _ in ()).throw(TimeoutError("gate gone")))
        assert "nightshift_batch_seats" not in scrape(port)  # absent, not frozen
    finally:
        run.close()


def test_night_gauges_are_absent_until_set_and_a_success_is_stamped() -> None:
    from pipelines.run_metrics import serving_night

    run = RunMetrics("r1")
    text = lambda: generate_latest(run.registry).decode()  # noqa: E731
    assert "nightshift_night_running" not in text()
    with serving_night(run, deadline_ts=1000.0, clock=lambda: 2000.0) as night:
        assert "nightshift_night_running 1.0" in text()
        assert "nightshift_night_deadline_timestamp_seconds 1000.0" in text()
        assert "nightshift_last_success_timestamp_seconds" not in text()
        night.value = "success"
    assert "nightshift_night_running 0.0" in text()
    assert "nightshift_night_failed 0.0" in text()
    assert "nightshift_last_success_timestamp_seconds 2000.0" in text()


def test_a_night_that_raises_reads_failed_and_its_port_is_closed() -> None:
    import pytest

    from pipelines.run_metrics import serving_night

    run = RunMetrics("r1")
    with pytest.raises(RuntimeError), serving_night(run, port=0):
        port = run.port
        assert "nightshift_night_running 1.0" in scrape(port)
        raise RuntimeError("replica gone")
    assert run.night.values["failed"] == 1 and "last_success" not in run.night.values
    with pytest.raises(httpx.ConnectError):
        scrape(port)


def test_a_pushgateway_that_refuses_fails_the_night_before_any_work() -> None:
    import pytest

    from pipelines.run_metrics import PushError, serving_night

    ran = []
    with pytest.raises(PushError, match="127.0.0.1:9"):
        with serving_night(RunMetrics("r1"), pushgateway="http://127.0.0.1:9"):
            ran.append(True)
    assert not ran


def test_policy_none_reads_uncapped_not_its_placeholder_caps() -> None:
    from scheduler.admission import NoAdmissionControl, Observation

    d = NoAdmissionControl().decide(Observation(t=0.0, replica="r1"))
    caps = {"r1": {"batch_seats": d.batch_seats, "pause": d.pause, "reason": d.reason}}
    assert describe_caps(caps) == "r1 uncapped"
