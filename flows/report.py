"""A run's report: Markdown and an HTML page with PNG plots, read from the warehouse.

The figures come from the named queries in `sql/` (via `warehouse.queries`), so the report, the
`nightshift sql` prompt and any dashboard agree to the digit. Markdown and HTML are rendered from the
same list of sections, so the two never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flows import report_plots
from flows.report_render import Section, hours, num, pct, render_html, render_markdown, usd, when

LATENCY_HEADERS = [
    "class",
    "requests",
    "failed",
    "TTFT p50",
    "TTFT p95",
    "TTFT p99",
    "ITL p50",
    "ITL p95",
    "ITL p99",
    "E2E p50",
    "E2E p95",
    "E2E p99",
]


class ReportError(ValueError):
    """The report cannot be made; the message says what to do instead."""


@dataclass
class ReportData:
    """Everything the report shows about one run, as plain rows from the warehouse."""

    run_id: str
    summary: dict
    latency: list[dict]
    windows: list[dict]
    goodput: dict
    cost: dict
    caps: list[dict]
    peers: list[dict] = field(default_factory=list)


@dataclass
class ReportFiles:
    """Where a report was written."""

    run_id: str
    markdown: Path
    html: Path
    plots: list[Path]


def latest_run(con) -> str:
    """The run a report shows when none is named: the one that started last."""
    from warehouse.queries import rows

    found = rows(con, "latest_run")
    if not found:
        raise ReportError("the warehouse holds no runs yet: load one with `nightshift ingest`")
    return found[0]["run_id"]


def gather(con, run_id: str) -> ReportData:
    """Read one run's report figures from the warehouse."""
    from warehouse.queries import rows

    summary = rows(con, "report_summary", run_id=run_id)
    if not summary:
        raise ReportError(
            f"no run {run_id!r} in the warehouse: list runs with "
            '`nightshift sql "SELECT run_id FROM runs"` or load it with `nightshift ingest`'
        )
    return ReportData(
        run_id=run_id,
        summary=summary[0],
        latency=rows(con, "report_latency", run_id=run_id),
        windows=rows(con, "report_windows", run_id=run_id),
        goodput=rows(con, "report_goodput", run_id=run_id)[0],
        cost=rows(con, "report_cost", run_id=run_id)[0],
        caps=rows(con, "report_caps", run_id=run_id),
        peers=rows(con, "report_peers", run_id=run_id),
    )


def write_report(
    results: Path | str, run_id: str | None = None, out: Path | str | None = None
) -> ReportFiles:
    """Write `report.md`, `report.html` and the plots of a run (the latest by default)."""
    from warehouse.db import connect, db_path

    con = connect(db_path(results), read_only=True)
    try:
        run_id = run_id or latest_run(con)
        data = gather(con, run_id)
    finally:
        con.close()
    out_dir = Path(out) if out else Path(results) / "reports" / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = draw_plots(data, out_dir)
    sections = build_sections(data)
    md = out_dir / "report.md"
    md.write_text(render_markdown(run_id, header_facts(data), sections))
    page = out_dir / "report.html"
    page.write_text(render_html(run_id, header_facts(data), sections))
    return ReportFiles(run_id, md, page, plots)


def draw_plots(data: ReportData, out_dir: Path) -> list[Path]:
    """The four plots, each a PNG beside the report files."""
    s = data.summary
    return [
        report_plots.latency_plot(
            data.windows,
            "chat_itl_p99_ms",
            s["slo_itl_p99_ms"],
            "Chat ITL p99 per window",
            out_dir / "chat_itl_p99.png",
        ),
        report_plots.latency_plot(
            data.windows,
            "chat_ttft_p99_ms",
            s["slo_ttft_p99_ms"],
            "Chat TTFT p99 per window",
            out_dir / "chat_ttft_p99.png",
        ),
        report_plots.throughput_plot(data.windows, out_dir / "batch_tokens_per_s.png"),
        report_plots.caps_plot(data.caps, data.windows, out_dir / "controller_caps.png"),
    ]


def build_sections(data: ReportData) -> list[Section]:
    """The report's content, format-free."""
    s, g, c = data.summary, data.goodput, data.cost
    headline = Section(
        "Batch throughput within the SLO",
        facts=[
            (
                "Batch tokens/s in windows that held the SLO",
                f"{num(g['slo_batch_tokens_per_s'])} tokens/s"
                f" ({num(g['goodput_documents_per_hour'])} documents/h)",
            ),
            (
                "Batch throughput, all windows",
                f"{num(g['batch_tokens_per_s'])} tokens/s"
                f" ({num(g['documents_per_hour'])} documents/h)",
            ),
            (
                "SLO windows met",
                f"{g['windows_met']} of {g['windows']} ({pct(g['slo_attainment'])})",
            ),
        ],
        note="Goodput counts batch work finished in windows where chat held its SLO, over the whole run.",
    )
    cost = Section(
        "Cost",
        facts=[
            (
                "Run cost",
                f"${c['cost_usd']:,.2f} ({c['replicas']} replicas x ${c['hourly_usd']:,.2f}/h"
                f" x {hours(c['duration_s'])})",
            ),
            ("Per 1M batch tokens", usd(c["usd_per_1m_batch_tokens"])),
            ("Per document", usd(c["usd_per_document"])),
        ],
        note="The replicas also served chat; the whole bill is charged to batch work.",
    )
    latency = Section(
        "Latency (ms)",
        headers=LATENCY_HEADERS,
        rows=[
            [r["class"], f"{r['requests']:,}", f"{r['failed']:,}"]
            + [num(r[f"{m}_{q}_ms"]) for m in ("ttft", "itl", "e2e") for q in ("p50", "p95", "p99")]
            for r in data.latency
        ],
        note="TTFT and E2E per request, ITL per token gap; E2E over requests that finished ok.",
    )
    work = Section(
        "Work",
        facts=[
            (
                "Documents",
                f"{s['documents_done']:,} done, {s['documents_failed']:,} failed,"
                f" {s['documents_skipped']:,} skipped of {s['documents']:,}",
            ),
            (
                "Requests",
                f"{s['chat_requests']:,} chat, {s['batch_requests']:,} batch,"
                f" {s['failed_requests']:,} failed",
            ),
            (
                "Batch tokens",
                f"{s['batch_tokens']:,} ({s['batch_cached_tokens']:,} prompt tokens cached)",
            ),
            ("Controller decisions", f"{s['decisions']:,}"),
        ],
    )
    plots = Section(
        "Over time",
        images=[
            ("chat_itl_p99.png", "Chat ITL p99 per window against the SLO"),
            ("chat_ttft_p99.png", "Chat TTFT p99 per window against the SLO"),
            ("batch_tokens_per_s.png", "Batch tokens/s per window"),
            ("controller_caps.png", "Controller caps over time"),
        ],
        note="Shaded windows: chat broke its SLO (ITL p99, TTFT p99 or a failed chat request).",
    )
    sections = [headline, cost, latency, work, plots]
    if len(data.peers) > 1:
        sections.insert(1, peers_section(data))
    return sections


def peers_section(data: ReportData) -> Section:
    """Other runs over the same corpus: the uncontrolled and static baselines beside this one."""
    rows = [
        [
            p["run_id"] + (" (this run)" if p["run_id"] == data.run_id else ""),
            p["policy"] or "-",
            num(p["slo_batch_tokens_per_s"]),
            num(p["batch_tokens_per_s"]),
            pct(p["slo_attainment"]),
            num(p["chat_itl_p99_ms"]),
            num(p["chat_ttft_p99_ms"]),
            usd(p["usd_per_1m_batch_tokens"]),
        ]
        for p in data.peers
    ]
    headers = [
        "run",
        "policy",
        "goodput tok/s",
        "batch tok/s",
        "SLO windows met",
        "chat ITL p99",
        "chat TTFT p99",
        "$ / 1M batch tokens",
    ]
    return Section(
        "Beside other runs on this corpus",
        headers=headers,
        rows=rows,
        note="Same corpus fingerprint; best goodput first. Latencies in ms.",
    )


def header_facts(data: ReportData) -> list[tuple[str, str]]:
    """What the run was: config, policy, when, how long, held to which SLO."""
    s = data.summary
    slo = f"chat ITL p99 <= {s['slo_itl_p99_ms']:g} ms, TTFT p99 <= {s['slo_ttft_p99_ms']:g} ms"
    if s["slo_e2e_p99_ms"] is not None:
        slo += f", E2E p99 <= {s['slo_e2e_p99_ms']:g} ms"
    return [
        ("Engine config", s["engine_config"] or "-"),
        ("Admission policy", s["policy"] or "-"),
        ("Started", when(s["started_at"])),
        ("Duration", hours(s["duration_s"])),
        ("SLO", f"{slo}, per {s['window_s']:g} s window"),
        ("Corpus", s["corpus_path"] or "-"),
    ]
