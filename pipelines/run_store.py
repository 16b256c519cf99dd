"""A run's files, written by the driver: the single writer of `results/runs/<run_id>/`'s tables.

The one other writer is the Gate, which appends to the run's request journal (`journal/`, see
`pipelines/request_journal.py`); the driver turns the journal into request rows. The run folder is
created 0700: summaries are the corpus's content, and nothing else on the host needs to read them.

Outcomes are appended as Parquet parts the moment documents finish, so a run that is killed keeps
everything it finished, and a rerun with the same run id reads the parts to skip those documents.
At the end the documents table is compacted to one row per document (the latest), because a
document that failed in one attempt may succeed in the next.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from pipelines.request_journal import (
    KILLED_IN_FLIGHT,
    journaled_rows,
    read_events,
    unrecorded_requests,
)
from warehouse.run_files import (
    RunFilesError,
    RunMeta,
    corpus_fingerprint,
    read_meta,
    read_table,
    run_dir,
    table_files,
    write_meta,
    write_table,
)


class RunMismatch(ValueError):
    """A rerun whose inputs differ from the run it would resume."""


class RunStore:
    """Reads and appends the files of one run."""

    def __init__(self, results: str | Path, run_id: str) -> None:
        self.run_id = run_id
        self.dir = run_dir(results, run_id)
        self._seq = itertools.count()

    def begin(self, meta: RunMeta) -> RunMeta:
        """Start or resume the run. A resume must read the same corpus; it keeps the first start."""
        meta.corpus_fingerprint = meta.corpus_fingerprint or corpus_fingerprint(meta.corpus_path)
        if (self.dir / "run.json").exists():
            old = read_meta(self.dir)
            if old.corpus_fingerprint != meta.corpus_fingerprint:
                raise RunMismatch(
                    f"run {self.run_id} already exists with a different corpus "
                    f"({old.corpus_path}, fingerprint {old.corpus_fingerprint[:12]}); "
                    "use a new --run-id, or the same corpus to resume it"
                )
            meta.started = old.started
        meta.started = meta.started or time.time()
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        write_meta(self.dir, meta)
        return meta

    def new_journal(self) -> Path:
        """The request journal file of the attempt starting now (the Gate writes it)."""
        return self.dir / "journal" / f"{time.time_ns()}.jsonl"

    def recover_journal(self, killed: str = KILLED_IN_FLIGHT) -> list[dict]:
        """Write the request rows the journal holds and the requests table lacks, and the Gate's
        journaled decision and engine-step rows, then remove the journal: called when an attempt
        starts (an earlier one may have been killed) and when it ends. `killed` is the error of
        requests granted and never released. Returns the request rows written."""
        folder = self.dir / "journal"
        files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
        if not files:
            return []
        requests = read_table(self.dir, "requests", run_id=self.run_id)
        recorded = set(requests.column("request_id").to_pylist())
        documents = read_table(self.dir, "documents", run_id=self.run_id)
        finished = set(documents.column("doc_id").to_pylist())
        events = [e for f in files for e in read_events(f)]
        rows = unrecorded_requests(self.run_id, events, recorded, finished, killed)
        if rows:
            self._part("requests", rows)
        for table, made in journaled_rows(events).items():
            if made:
                self._part(table, made)
        for f in files:
            f.unlink()
        return rows

    def finished_doc_ids(self) -> set[str]:
        """Documents that already have a summary: a rerun does not redo them."""
        table = read_table(self.dir, "summaries", run_id=self.run_id)
        return set(table.column("doc_id").to_pylist())

    def write_rejections(self, rows: list[dict]) -> None:
        """Documents refused before any request (empty, not UTF-8, over-long, duplicated)."""
        if rows:
            self._part("documents", rows)

    def write_outcomes(self, rows: Iterable[dict]) -> None:
        """Outcome rows of `pipelines.workers.Summarize`: one per document."""
        rows = list(rows)
        if not rows:
            return
        finished = [r for r in rows if r["status"] != "stopped"]  # stopped: left for a rerun
        if finished:
            self._part(
                "documents",
                [
                    {
                        k: r[k]
                        for k in (
                            "doc_id",
                            "status",
                            "reason",
                            "prompt_tokens",
                            "sections",
                            "summary_tokens",
                            "t_done",
                        )
                    }
                    for r in finished
                ],
            )
        done = [r for r in rows if r["status"] == "done"]
        if done:
            self._part(
                "summaries",
                [
                    {
                        "doc_id": r["doc_id"],
                        "summary": r["summary"],
                        "summary_tokens": r["summary_tokens"],
                        "sections": r["sections"],
                        "replicas": json.loads(r["replicas"]),
                    }
                    for r in done
                ],
            )
        requests = [q for r in rows for q in json.loads(r["requests"])]
        gaps = [g for r in rows for g in json.loads(r["gaps"])]
        if requests:
            self._part("requests", requests)
        if gaps:
            self._part("token_gaps", gaps)

    def write_engine_histograms(self, itl: list[dict], ttft: list[dict]) -> None:
        """The replicas' ITL and chat TTFT histograms through one attempt (`serving.engine_itl`):
        the morning report judges chat by them, since in production nightshift never sees chat's
        requests."""
        if itl:
            self._part("engine_itl", itl)
        if ttft:
            self._part("engine_ttft", ttft)

    def finish(self, meta: RunMeta) -> RunMeta:
        """Compact the documents table and stamp the end time."""
        self._compact_documents()
        meta.ended = time.time()
        write_meta(self.dir, meta)
        return meta

    def _part(self, table: str, rows: list[dict]) -> None:
        part = f"{time.time_ns()}-{next(self._seq)}"
        write_table(self.dir, table, rows, run_id=self.run_id, part=part)

    def _compact_documents(self) -> None:
        files = table_files(self.dir, "documents")
        if not files:
            return
        table = read_table(self.dir, "documents", run_id=self.run_id)
        latest = _latest_per_doc(table)
        write_table(self.dir, "documents", latest, run_id=self.run_id)
        for f in files:
            if f.parent.name == "documents":  # the parts; the main file was just rewritten
                f.unlink()
        parts_dir = self.dir / "documents"
        if parts_dir.is_dir() and not any(parts_dir.iterdir()):
            parts_dir.rmdir()


def _latest_per_doc(table: pa.Table) -> pa.Table:
    """The last row written (parts are read in write order) per document attempt. A row skipped as
    a duplicated doc_id is another input row that happens to share the id, so it is kept beside
    the row of the document itself rather than replacing it."""
    keep: dict[tuple[str, bool], int] = {}
    ids, statuses = table.column("doc_id").to_pylist(), table.column("status").to_pylist()
    for i, (doc_id, status) in enumerate(zip(ids, statuses, strict=True)):
        keep[(doc_id, status == "skipped")] = i
    return table.take(pa.array(sorted(keep.values()), pa.int64()))


def check_resumable(results: str | Path, run_id: str, corpus_path: str) -> None:
    """Fail before any work when `run_id` exists with another corpus (used by the CLI up front)."""
    directory = run_dir(results, run_id)
    if not (directory / "run.json").exists():
        return
    try:
        old = read_meta(directory)
    except RunFilesError as exc:
        raise RunMismatch(str(exc)) from exc
    if old.corpus_fingerprint != corpus_fingerprint(corpus_path):
        raise RunMismatch(
            f"run {run_id} already exists with a different corpus ({old.corpus_path}); "
            "use a new --run-id, or the same corpus to resume it"
        )
