"""What the soak reads while its night runs and after it: summaries as they land, the resident
memory of the night's processes, the run's tables and the warehouse, and the report made of them.

Summary parts are written once and never rewritten (`pipelines/run_store.py`), so the watch reads
each new part file once: the set of every document seen summarized during the night is what the
end of the night is checked against (a summary that vanished is a lost document).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow.parquet as pq

from bench import processes
from bench.soak_memory import ProcessMemory, by_role, growth, unmeasured
from bench.soak_night import Night
from bench.soak_report import failures, ledger, metrics_outage, slo_windows_held
from warehouse.run_files import read_meta, read_table, table_files, write_table


class SummaryWatch:
    """Every doc_id seen in the run's summary files so far (`seen`) and the rows read (`rows`)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.seen: set[str] = set()
        self.rows = 0
        self._read: set[Path] = set()

    def poll(self) -> int:
        """Read summary files that appeared since the last poll; returns the rows read so far."""
        for path in table_files(self.run_dir, "summaries"):
            if path in self._read:
                continue
            with contextlib.suppress(OSError, ValueError):  # half-listed; read it next time
                ids = pq.read_table(path, columns=["doc_id"]).column("doc_id").to_pylist()
                self.seen.update(ids)
                self.rows += len(ids)
                self._read.add(path)
        return self.rows


def sample_memory(night: Night) -> list[ProcessMemory]:
    """VmRSS of every process of the replica, the current run attempt (driver, Ray, Prefect's
    server), Prometheus and chat load."""
    roots: list[tuple[str, int]] = []
    if night.replica is not None:
        roots.append(("replica", night.replica.pid))
    if night.run is not None and night.run.proc.poll() is None:
        roots.append(("run", night.run.proc.pid))
    if night.prometheus is not None and night.prometheus.proc is not None:
        roots.append(("prometheus", night.prometheus.pid))
    if night.chat is not None and night.chat.poll() is None:
        roots.append(("chat-load", night.chat.pid))
    sample = []
    for owner, root in roots:
        for pid in sorted({root} | processes.descendants(root)):
            rss = processes.rss_kib(pid)
            if rss:
                sample.append(ProcessMemory(pid, owner, processes.command(pid), rss, pid == root))
    return sample


def merge_chat(chat_dir: Path, run_dir: Path, run_id: str) -> int:
    """Chat load's request and token-gap rows (written under the night's run id) added to the
    run's tables, so the warehouse judges chat's SLO windows by them; returns the requests."""
    if not table_files(chat_dir, "requests"):  # chat load wrote none, or never started
        return 0
    requests = read_table(chat_dir, "requests", run_id=run_id)
    write_table(run_dir, "requests", requests, run_id=run_id, part="chat-load")
    gaps = read_table(chat_dir, "token_gaps", run_id=run_id)
    write_table(run_dir, "token_gaps", gaps, run_id=run_id, part="chat-load")
    return requests.num_rows


def run_tables(run_dir: Path, run_id: str) -> dict:
    """The run's documents (in write order), summary ids (one per row) and decisions."""
    documents = read_table(run_dir, "documents", run_id=run_id).select(
        ["doc_id", "status", "reason"]
    )
    return {
        "documents": documents.to_pylist(),
        "summary_ids": read_table(run_dir, "summaries", run_id=run_id).column("doc_id").to_pylist(),
        "decisions": read_table(run_dir, "decisions", run_id=run_id)
        .select(["t", "reason", "pause"])
        .to_pylist(),
        "window_s": read_meta(run_dir).slo["window_s"],
    }


def warehouse_figures(results: Path, run_id: str) -> dict:
    """The run loaded afresh into the warehouse: its summary ids (one per row) and its chat rows
    of `slo_windows`."""
    from warehouse.db import connect, db_path
    from warehouse.load import load_results

    load_results(results, [run_id])
    con = connect(db_path(results), read_only=True)
    try:
        ids = [
            r[0]
            for r in con.execute(
                "SELECT doc_id FROM summaries WHERE run_id = ?", [run_id]
            ).fetchall()
        ]
        windows = con.sql(
            "SELECT window_idx, t_start, slo_met, requests, failed, itl_p99_ms, ttft_p99_ms "
            "FROM slo_windows WHERE run_id = ? AND class = 'chat' ORDER BY window_idx",
            params=[run_id],
        ).to_arrow_table()
    finally:
        con.close()
    return {"summary_ids": ids, "windows": windows.to_pylist()}


def build_report(night, log, watch, args, left: list[str], interrupted: bool) -> dict:
    """soak.json: the night's ledger, chat's windows, memory, the faults and the run attempts."""
    tables = run_tables(night.run_dir, night.run_id)
    chat_requests = merge_chat(night.out / "chat", night.run_dir, night.run_id)
    warehouse = warehouse_figures(night.results, night.run_id)
    corpus_ids = pq.read_table(night.corpus, columns=["doc_id"]).column("doc_id").to_pylist()
    last = night.run
    complete = bool(last and last.rc == 0 and last.summary and not last.summary["partial"])
    figures = ledger(corpus_ids, tables["documents"], tables["summary_ids"], watch.seen, complete,
                     warehouse["summary_ids"])  # fmt: skip
    for entry in log.faults:
        if "stopped_at" in entry:
            entry["controller"] = metrics_outage(
                tables["decisions"], entry["stopped_at"], entry["resumed_at"]
            )
    spans = [(f["at"], max(f["at"], f["ended_at"])) for f in log.faults if f["ok"]]
    memory = {"start": by_role(log.memory_start), "end": by_role(log.memory_end)}
    memory["growth"] = growth(memory["start"], memory["end"])
    return {
        "run_id": night.run_id,
        "engine_config": str(night.config_path),
        "minutes": args.minutes,
        "night_s": round(log.deadline_ts - log.t0, 1),
        "interrupted": interrupted,
        "documents": figures,
        "chat_requests": chat_requests,
        "slo_windows": slo_windows_held(warehouse["windows"], spans, tables["window_s"]),
        "memory": memory,
        "memory_start_at_s": log.memory_start_at and round(log.memory_start_at - log.t0, 1),
        "memory_series": log.memory_series,
        "faults": log.faults,
        "attempts": [a.row(log.t0) for a in night.attempts],
        "events": log.events,
        "left_at_close": left,
        "failures": failures(figures, memory["growth"], unmeasured(memory["start"], memory["end"])),
    }
