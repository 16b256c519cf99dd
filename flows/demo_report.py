"""The demo's morning report, from the warehouse: what a platform team looks at after a night.

Chat latency per class against the SLO, batch documents, tokens/s and cost, and where the DuckDB
file and the HTML report are; for an itemized variant (`make demo`) also each SLO window's
chat p99s, each document's requests, and the replica's preemptions over the night.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from flows.demo_variants import Demo
from scheduler.slo import SLO


def print_morning_report(
    results: Path,
    run_id: str,
    out: dict,
    slo: SLO,
    demo: Demo,
    preempted: tuple[float, float] | None = None,
) -> None:
    """`preempted`: vLLM's preemption counter (summed over the replicas) before and after the
    night, printed where the variant is itemized."""
    from warehouse.run_figures import run_figures

    figures = run_figures(results, run_id)
    db, latency, goodput, cost = figures.db, figures.latency, figures.goodput, figures.cost
    console = Console(width=150)
    table = Table(title=f"run {run_id}: latency (ms)")
    for col in (
        "class",
        "requests",
        "TTFT p50",
        "p95",
        "p99",
        "ITL p50",
        "p95",
        "p99",
        "E2E p50",
        "p95",
        "p99",
    ):
        table.add_column(col, justify="right")
    for row in latency:
        table.add_row(
            row["class"],
            str(row["requests"]),
            *(_ms(row[f"{m}_p{q}_ms"]) for m in ("ttft", "itl", "e2e") for q in (50, 95, 99)),
        )
    console.print(table)
    if demo.itemized:
        console.print(window_table(figures.windows, slo))
    console.print(
        f"SLO: chat ITL p99 ≤ {slo.chat_itl_p99_ms:.0f} ms, TTFT p99 ≤ "
        f"{slo.chat_ttft_p99_ms:.0f} ms per {slo.window_s:.0f} s window: held in "
        f"{goodput['windows_met']} of {goodput['windows']} windows (ITL judged by the replica's "
        "own histogram, as the Gate reads it; the table's ITL is what the chat client saw)"
    )
    job = out["job"]
    if demo.itemized:
        console.print(document_table(figures.documents))
    console.print(
        f"batch: {job['docs_done']} documents done, {job['docs_failed']} failed; "
        f"{goodput['batch_tokens_per_s']:,.0f} tokens/s, "
        f"{goodput['slo_batch_tokens_per_s']:,.0f} tokens/s in windows that held the SLO, "
        f"{goodput['documents_per_hour']:,.0f} documents/hour"
    )
    if demo.itemized and preempted is not None:
        before, after = preempted
        console.print(
            f"preemptions (vllm:num_preemptions_total): {before:.0f} before the night, "
            f"{after:.0f} after ({after - before:+.0f})"
        )
    console.print(
        f"cost: ${cost['cost_usd']:.4f} for the run, "
        f"${cost['usd_per_1m_batch_tokens']:.3f} per 1M batch tokens, "
        f"${cost['usd_per_document']:.5f} per document"
    )
    console.print(
        f"\nDuckDB: {db}\n"
        f'  .venv/bin/nightshift sql "SELECT class, ttft_p99_ms, itl_p99_ms FROM class_latency '
        f"WHERE run_id = '{run_id}'\"\n"
        f'  .venv/bin/nightshift sql "SELECT window_idx, class, itl_p99_ms, slo_met FROM '
        f"slo_windows WHERE run_id = '{run_id}' ORDER BY window_idx\""
    )
    console.print(f"report: {out['report']['html']}")


def window_table(windows: list[dict], slo: SLO) -> Table:
    """Chat's p99s in each SLO window beside the SLO (ITL as the Gate judges it)."""
    table = Table(title=f"chat per {slo.window_s:.0f} s window (ms)")
    itl, ttft = f"ITL p99 ≤ {slo.chat_itl_p99_ms:.0f}", f"TTFT p99 ≤ {slo.chat_ttft_p99_ms:.0f}"
    for col in ("window", "from s", "chats", itl, ttft, "SLO"):
        table.add_column(col, justify="right")
    for w in windows:
        table.add_row(
            str(w["window_idx"]),
            f"{w['t_rel_s']:.0f}",
            str(w["requests"]),
            _ms(w["itl_p99_ms"]),
            _ms(w["ttft_p99_ms"]),
            "held" if w["slo_met"] else "missed",
        )
    return table


def document_table(documents: list[dict]) -> Table:
    """Each document: its length, and the batch requests that summarized it."""
    table = Table(title="documents")
    for col in ("document", "status", "tokens", "requests", "stage", "prompt tokens", "cached"):
        table.add_column(col, justify="right")
    for d in documents:
        table.add_row(
            d["doc_id"],
            f"{d['status']}: {d['reason']}" if isinstance(d["reason"], str) else d["status"],
            _count(d["doc_tokens"]),
            str(d["requests"]),
            d["stages"] or "–",
            _count(d["request_prompt_tokens"]),
            _count(d["cached_tokens"]),
        )
    return table


def _count(value) -> str:
    return "–" if value is None or value != value else f"{value:,.0f}"


def _ms(value) -> str:
    """A latency cell: NULL (a class without such figures, e.g. batch ITL) reads as a dash."""
    return "–" if value is None or value != value else f"{value:.1f}"
