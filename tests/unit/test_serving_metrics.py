"""Chat latency in vLLM's serving-benchmark vocabulary: TPOT, the statistics, goodput."""

from __future__ import annotations

import pytest

from bench.serving_metrics import (
    goodput,
    goodput_slos,
    latency_stats_ms,
    meets,
    parse_goodput,
    request_latency,
    tpot_s,
)
from scheduler.records import RequestRecord
from scheduler.slo import SLO


def _req(ttft: float, e2e: float, out: int, status: str = "ok") -> RequestRecord:
    return RequestRecord("r", f"q{ttft}{e2e}", "chat", "chat", "a", output_tokens=out,
                         ttft_s=ttft, e2e_s=e2e, status=status)  # fmt: skip


def test_tpot_is_decode_time_per_token_after_the_first():
    assert tpot_s(_req(0.2, 1.2, 11)) == pytest.approx(0.1)
    assert tpot_s(_req(0.2, 0.2, 1)) is None


def test_statistics_are_the_serving_benchmarks():
    stats = latency_stats_ms([0.001 * v for v in range(1, 1001)])
    assert set(stats) == {"mean", "median", "p50", "p90", "p95", "p99", "p99.9"}
    assert stats["mean"] == pytest.approx(500.5) and stats["median"] == stats["p50"]
    assert stats["p90"] < stats["p99"] < stats["p99.9"] <= 1000.0
    assert latency_stats_ms([])["p99.9"] is None


def test_goodput_counts_requests_meeting_every_slo_per_second():
    chat = [_req(0.1, 1.1, 11), _req(2.0, 3.0, 11), _req(0.1, 5.1, 11), _req(0.1, 0.2, 1, "error")]
    slos = {"ttft": 500.0, "tpot": 100.0}
    assert [meets(r, slos) for r in chat] == [True, False, False, False]
    g = goodput(chat, slos, seconds=2.0)
    assert g["goodput"] == 0.5 and g["goodput_share"] == 0.25 and g["goodput_slos_ms"] == slos
    assert request_latency(chat)["tpot_ms"]["median"] == pytest.approx(100.0)


def test_goodput_slos_follow_the_window_slo_and_parse_like_vllm():
    assert goodput_slos(SLO(chat_itl_p99_ms=40, chat_ttft_p99_ms=800)) == {"ttft": 800, "tpot": 40}
    assert parse_goodput(["ttft:500", "e2el:9000"]) == {"ttft": 500.0, "e2el": 9000.0}
    with pytest.raises(ValueError, match="KEY:MS"):
        parse_goodput(["itl:50"])
