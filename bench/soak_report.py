"""What the soak's night did to its documents, chat's SLO windows and the controller, from its
tables.

Pure: rows in, figures out (`bench.soak` reads the run's files and the warehouse). The document
ledger's invariants are the night's promise: no document lost, none summarized twice, whatever
was killed on the way.

A document is *lost* when
- its last `documents` row says done and it has no summary row (the outcome was recorded, the
  summary was not);
- a summary seen during the night is gone at its end; or
- the night ended normally (not cut by its deadline) and the document has no row at all: nothing
  is left to do, so a document never recorded fell through.
At a night cut by its deadline, documents without a row are *left to do*, not lost: a rerun with
the same run id takes them. A document is *duplicated* when it has more than one summary row, in
the run's files or in the warehouse.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY_LINE = re.compile(
    r"run (?P<run_id>\S+): (?P<done>\d+) done, (?P<failed>\d+) failed, (?P<skipped>\d+) skipped, "
    r"(?P<already>\d+) already done(?:, PARTIAL: (?P<left>\d+) left at the deadline)?"
)


def latest_rows(documents: Iterable[dict]) -> dict[str, dict]:
    """The last row per document (rows in write order), apart from rows `skipped` as a second
    input row under a taken id: those are another row sharing the id, not the document."""
    latest: dict[str, dict] = {}
    for row in documents:
        if row["status"] == "skipped" and row["doc_id"] in latest:
            continue
        latest[row["doc_id"]] = row
    return latest


def latest_status(documents: Iterable[dict]) -> dict[str, str]:
    """The last status per document (see `latest_rows`)."""
    return {d: row["status"] for d, row in latest_rows(documents).items()}


def reason_line(reason: str | None) -> str:
    """A failure reason's last line, without terminal colours: a reason that arrived through Ray
    carries the whole remote traceback, and its last line is the error itself."""
    lines = [ln.strip() for ln in _ANSI.sub("", reason or "").splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def ledger(
    corpus_ids: Sequence[str],
    documents: Iterable[dict],
    summary_ids: Sequence[str],
    seen_summary_ids: Iterable[str],
    night_complete: bool,
    warehouse_summary_ids: Sequence[str] | None = None,
) -> dict:
    """The document ledger (see the module's docstring for what lost and duplicated mean).

    `summary_ids` holds one entry per summary row at the end (repeats are duplicates),
    `seen_summary_ids` every id seen in a summary row during the night, `warehouse_summary_ids`
    one entry per summary row of the run in the warehouse (None: not loaded)."""
    latest = latest_rows(documents)
    status = {d: row["status"] for d, row in latest.items()}
    summarized = set(summary_ids)
    counts = Counter(status.values())
    done_without_summary = sorted(
        d for d, s in status.items() if s == "done" and d not in summarized
    )
    vanished = sorted(set(seen_summary_ids) - summarized)
    unrecorded = sorted(set(corpus_ids) - set(status) - summarized)
    lost = sorted(
        set(done_without_summary) | set(vanished) | (set(unrecorded) if night_complete else set())
    )
    dup_files = _repeats(summary_ids)
    dup_warehouse = _repeats(warehouse_summary_ids or [])
    return {
        "corpus": len(set(corpus_ids)),
        "done": counts["done"],
        "failed": counts["failed"],
        "failed_reasons": dict(
            Counter(
                reason_line(r.get("reason")) for r in latest.values() if r["status"] == "failed"
            )
        ),
        "skipped": counts["skipped"],
        "left_to_do": 0 if night_complete else len(unrecorded),
        "lost": len(lost),
        "lost_docs": {
            "done_without_summary": done_without_summary,
            "summary_vanished": vanished,
            "never_recorded": unrecorded if night_complete else [],
        },
        "duplicated": len(set(dup_files) | set(dup_warehouse)),
        "duplicated_run_files": dup_files,
        "duplicated_warehouse": dup_warehouse,
        "summaries_without_done_row": sorted(
            summarized - {d for d, s in status.items() if s == "done"}
        ),
        "warehouse_summaries": None
        if warehouse_summary_ids is None
        else len(warehouse_summary_ids),
        "night_complete": night_complete,
    }


def _repeats(ids: Iterable[str]) -> dict[str, int]:
    return {d: n for d, n in sorted(Counter(ids).items()) if n > 1}


def parse_run_summary(output: str) -> dict | None:
    """The last `run ID: N done, ...` line of `nightshift run`'s output, as numbers; None when the
    attempt printed none (it was killed, or failed before its end)."""
    matches = list(_SUMMARY_LINE.finditer(output))
    if not matches:
        return None
    m = matches[-1]
    return {
        "done": int(m["done"]),
        "failed": int(m["failed"]),
        "skipped": int(m["skipped"]),
        "already_done": int(m["already"]),
        "left_at_deadline": int(m["left"] or 0),
        "partial": m["left"] is not None,
    }


def slo_windows_held(
    windows: Sequence[dict], spans: Sequence[tuple[float, float]], window_s: float
) -> dict:
    """Chat SLO windows held over the night (rows of the `slo_windows` view, chat class, with
    `t_start`, `requests` and `slo_met`), and among those that overlap no fault span (start, end),
    so that chat's figure apart from the outages the faults cause is there beside it. Only windows
    with chat requests count: the view holds a window without chat as met, and the run's last
    windows (after the deadline, while it drains) have none."""

    def overlaps(w: dict) -> bool:
        start, end = w["t_start"], w["t_start"] + window_s
        return any(a <= end and b >= start for a, b in spans)

    busy = [w for w in windows if w["requests"]]
    clear = [w for w in busy if not overlaps(w)]
    return {
        "held": sum(bool(w["slo_met"]) for w in busy),
        "total": len(busy),
        "held_outside_faults": sum(bool(w["slo_met"]) for w in clear),
        "total_outside_faults": len(clear),
        "without_chat": len(windows) - len(busy),
        "missed_windows": [w["window_idx"] for w in busy if not w["slo_met"]],
    }


def metrics_outage(decisions: Iterable[dict], stopped_at: float, resumed_at: float) -> dict:
    """What the controller decided while its Prometheus was stopped: how soon it first decided
    `stale`, whether every decision from then to the end of the outage paused batch, and how soon
    after Prometheus answered it opened batch again."""
    rows = sorted(decisions, key=lambda d: d["t"])
    during = [d for d in rows if stopped_at < d["t"] <= resumed_at]
    stale = [d for d in during if d["reason"] == "stale"]
    after_first = [d for d in during if stale and d["t"] >= stale[0]["t"]]
    opened = next((d for d in rows if d["t"] > resumed_at and not d["pause"]), None)
    return {
        "first_stale_after_s": round(stale[0]["t"] - stopped_at, 1) if stale else None,
        "stale_decisions": len(stale),
        "paused_after_first_stale": bool(stale) and all(d["pause"] for d in after_first),
        "reopened_after_s": round(opened["t"] - resumed_at, 1) if opened else None,
        "reopened_reason": opened["reason"] if opened else None,
    }


def failures(
    ledger_figures: dict, memory_rows: Sequence[dict], unmeasured: Sequence[str] = ()
) -> list[str]:
    """Why the soak fails, one line each; empty when it passes (0 lost, 0 duplicated, every
    long-lived role measured at both ends and none's per-process memory grown past its limit)."""
    out = []
    if unmeasured:
        out.append(f"memory not measured at both ends: {', '.join(unmeasured)}")
    if ledger_figures["lost"]:
        out.append(f"{ledger_figures['lost']} document(s) lost")
    if ledger_figures["duplicated"]:
        out.append(f"{ledger_figures['duplicated']} document(s) summarized more than once")
    for row in memory_rows:
        if row["over_limit"]:
            out.append(
                f"{row['role']}: resident memory per process {row['start_mib']} -> "
                f"{row['end_mib']} MiB (+{row['growth']:.0%})"
            )
    return out


def format_report(r: dict) -> str:
    """soak.json as a short table for people."""
    d, w = r["documents"], r["slo_windows"]
    lines = [
        f"soak {r['run_id']}: {r['night_s'] / 60:.1f} min night on {r['engine_config']}"
        + (" (INTERRUPTED)" if r["interrupted"] else ""),
        f"documents: corpus {d['corpus']}, done {d['done']}, failed {d['failed']}, "
        f"skipped {d['skipped']}, left to do {d['left_to_do']}, lost {d['lost']}, "
        f"duplicated {d['duplicated']} (warehouse summaries {d['warehouse_summaries']})",
        f"chat SLO windows held: {w['held']} / {w['total']} "
        f"({w['held_outside_faults']} / {w['total_outside_faults']} away from the faults); "
        f"{r['chat_requests']} chat requests",
        f"{'memory per process, MiB':34} {'start':>8} {'end':>8} {'growth':>8}",
    ]
    for reason, n in d["failed_reasons"].items():
        lines.insert(2, f"  failed {n}: {reason}")
    for m in r["memory"]["growth"]:
        grown = "-" if m["growth"] is None else f"{m['growth']:+.1%}"
        start, end = (f"{v:.1f}" if v is not None else "-" for v in (m["start_mib"], m["end_mib"]))
        counts = f"{m['start_processes']}->{m['end_processes']}"
        mark = " OVER" if m["over_limit"] else ("" if m["judged"] else " (not judged)")
        mark += "" if m["same_processes"] or m["growth"] is None else " (replaced)"
        lines.append(f"  {m['role'][:24]:24} {counts:>7} {start:>8} {end:>8} {grown:>8}{mark}")
    lines.append("faults:")
    for f in r["faults"]:
        back = f["recovered_after_s"]
        lines.append(
            f"  {f['at_s']:7.0f} s {f['fault']:19} {'ok' if f['ok'] else 'NOT DONE':8} "
            f"{f['detail']}"
            + (f"; next summary {back:.0f} s after" if back is not None else "; no summary after")
        )
        if "controller" in f:
            lines.append(f"{'':30}controller: {f['controller']}")
    lines.append(
        "attempts: " + "; ".join(f"{a['attempt']} rc {a['rc']} ({a['why']})" for a in r["attempts"])
    )
    lines.append("PASS" if not r["failures"] else "FAIL: " + "; ".join(r["failures"]))
    return "\n".join(lines)
