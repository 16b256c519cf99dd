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
from bench.chat_tally import ChatTally
from scheduler.records import RequestRecord, TokenGap
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
    spooled: int = 0
    """Records written to the run directory as they ended (`bench.chat_spool`) rather than held
    in `records`."""
    first_error: str | None = None
    """The first failed request's error, for a run in which none succeeded."""


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
    and prefix-cache hit share of a run's sent turns (`bench.chat_tally`, all at once)."""
    tally = ChatTally(goodput_slos or default_goodput_slos())
    for t in turns:
        tally.add(t.record, t.plan.session, t.planned_prompt_tokens)
    return tally.summary(window_s=window_s, not_sent=not_sent, planned=planned)


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
    """The run as a warehouse run directory: requests and token_gaps Parquet plus run.json (the
    tables are there already when the run spooled them into `directory`)."""
    from warehouse.run_files import RunMeta, write_meta, write_table

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not result.spooled:  # else the spool wrote them there as the run went
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
