"""What a chat load run produced: its sent turns and records, the summary, the run directory.

The summary is what the CLI prints and the benchmark compares: TTFT and E2E percentiles over
requests, ITL percentiles over every token gap of every request (a request with many tokens weighs
more, as it does for the users waiting on them), the achieved rate and the prefix-cache hit share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import serving_metrics
from bench.chat_sessions import TurnPlan
from bench.serving_metrics import goodput, request_latency, tpot_s
from scheduler.records import RequestRecord, TokenGap, percentile
from scheduler.slo import SLO


@dataclass
class SentTurn:
    """A turn that reached a replica: its plan, the prompt size it was built to, its record."""

    plan: TurnPlan
    planned_prompt_tokens: int
    history_turns: int
    record: RequestRecord


@dataclass
class ChatLoadResult:
    """Everything a run produced; `summary` is what the CLI prints and `--json` writes."""

    run_id: str
    records: list[RequestRecord]
    gaps: list[TokenGap]
    summary: dict
    turns: list[SentTurn]
    started: float
    """Wall-clock start, epoch seconds."""
    ended: float


def summarize(
    turns: list[SentTurn],
    *,
    window_s: float,
    not_sent: int = 0,
    planned: int | None = None,
    goodput_slos: Mapping[str, float] | None = None,
) -> dict:
    """Counts, latency statistics (bench/serving_metrics.py: TTFT, TPOT, ITL over every token gap,
    E2E), vLLM-style goodput against `goodput_slos` (default: `SLO()`'s targets), achieved rate
    and prefix-cache hit share of a run's sent turns."""
    records = [t.record for t in turns]
    latency = request_latency(records)
    counts = {k: len(v) for k, v in _samples(records).items()}
    ok = [r for r in records if r.status == "ok"]
    prompt = sum(r.prompt_tokens for r in ok)
    ratios = sorted(
        t.record.prompt_tokens / t.planned_prompt_tokens
        for t in turns
        if t.record.status == "ok" and t.record.prompt_tokens and t.planned_prompt_tokens
    )
    return {
        "requests": {
            "planned": planned if planned is not None else len(records) + not_sent,
            "sent": len(records),
            "ok": len(ok),
            "failed": sum(r.status in ("error", "timeout") for r in records),
            "cancelled": sum(r.status == "cancelled" for r in records),
            "not_sent": not_sent,
        },
        "sessions": len({t.plan.session for t in turns}),
        "window_s": round(window_s, 3),
        "achieved_rate": len(records) / window_s if window_s > 0 else 0.0,
        **{key: {**stats, "n": counts[key]} for key, stats in latency.items()},
        **goodput(records, goodput_slos or default_goodput_slos(), window_s),
        "prompt_tokens_mean": prompt / len(ok) if ok else 0.0,
        "output_tokens": sum(r.output_tokens for r in ok),
        "prefix_cache_hit_share": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        "prompt_tokens_over_planned_p50": percentile(ratios, 50) if ratios else None,
    }


def _samples(records: list[RequestRecord]) -> dict[str, list]:
    """What each statistic is taken over: ok requests (TTFT, TPOT, E2E) or token gaps (ITL)."""
    ok = [r for r in records if r.status == "ok"]
    return {
        "ttft_ms": [r for r in ok if r.ttft_s is not None],
        "tpot_ms": [r for r in ok if tpot_s(r) is not None],
        "itl_ms": [g for r in records for g in r.gaps],
        "e2e_ms": [r for r in ok if r.e2e_s is not None],
    }


def default_goodput_slos() -> dict[str, float]:
    """Per-request SLOs of chat-load's goodput when none are given: the default SLO's targets."""
    return serving_metrics.goodput_slos(SLO())


def write_run(
    directory: str | Path,
    result: ChatLoadResult,
    *,
    engine_config: str = "",
    hourly_usd: float = 0.0,
    hardware_count: int = 1,
    slo: dict | None = None,
) -> Path:
    """The run as a warehouse run directory: requests and token_gaps Parquet plus run.json."""
    from warehouse.run_files import RunMeta, write_meta, write_table

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_table(directory, "requests", [r.row() for r in result.records], run_id=result.run_id)
    write_table(directory, "token_gaps", [asdict(g) for g in result.gaps], run_id=result.run_id)
    meta = RunMeta(
        run_id=result.run_id,
        engine_config=engine_config,
        policy="chat-only",
        hardware_count=hardware_count,
        replicas=len(result.summary["replicas"]),
        hourly_usd=hourly_usd,
        started=result.started,
        ended=result.ended,
        **({"slo": slo} if slo else {}),
    )
    write_meta(directory, meta)
    return directory
