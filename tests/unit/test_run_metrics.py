import httpx

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


def test_policy_none_reads_uncapped_not_its_placeholder_caps() -> None:
    from scheduler.admission import NoAdmissionControl, Observation

    d = NoAdmissionControl().decide(Observation(t=0.0, replica="r1"))
    caps = {"r1": {"batch_seats": d.batch_seats, "pause": d.pause, "reason": d.reason}}
    assert describe_caps(caps) == "r1 uncapped"
