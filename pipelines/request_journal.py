"""The run's request journal: every batch permit granted and released, as it happens.

A document's request records reach the run's files only with the document's outcome, when the
whole document is finished. A run killed mid-night (kill -9, a lost host) would otherwise drop the
records of every request that belonged to an unfinished document, and the morning report would
show less work than the replicas did. So the Gate appends one JSON line per grant and per release
to `runs/<run_id>/journal/<attempt>.jsonl` the moment it happens, before the permit is returned: a
line written is in the kernel's page cache, so it survives the death of any process.

The Gate's own records, its decisions and the engine plug-ins' status as it read them, are
journaled the same way, one line per row as it is made, and reach the run's tables only from the
journal: an attempt whose Gate was killed keeps them up to its last line.

On the next start of the run, and at the end of every attempt, `RunStore.recover_journal` turns
what the journal holds and the requests table does not into request rows, marked for what they
were: `cancelled`, with an error that starts with `killed:`, for requests of documents that did not
finish; the original status with a `recovered:` note for requests of documents that did; and it
writes the journaled decision and engine-step rows. The journal is then removed, so a request or
a decision is recorded once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO

KILLED_IN_FLIGHT = "killed: in flight when the run's process died"
GATE_DIED_IN_FLIGHT = "killed: in flight when the run's Gate died"
WORKER_DIED_IN_FLIGHT = "killed: in flight when its worker died (its seat lease lapsed)"
CANCELLED_IN_FLIGHT = "cancelled: in flight when the run was stopped"
KILLED_UNFINISHED = (
    "killed: the run stopped before document {doc_id} finished (request ended {status})"
)
RECOVERED = "recovered: the run stopped before this record was written with its document"
JOURNALED_TABLES = ("decisions", "engine_steps")
"""The run tables the Gate writes only through the journal."""


class RequestJournal:
    """Appends grant and release events to one attempt's journal file (the Gate's side)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", buffering=1)  # noqa: SIM115 (held open)

    def granted(
        self, permit_id: str, doc_id: str, stage: str | None, replica: str, prompt: int, t: float
    ) -> None:
        self._write(
            {
                "event": "granted",
                "permit_id": permit_id,
                "doc_id": doc_id,
                "stage": stage,
                "replica": replica,
                "prompt_tokens": prompt,
                "t": t,
            }
        )

    def released(self, permit_id: str, row: dict | None, reason: str | None = None) -> None:
        """A permit given back: with its request's record, or without one and why (None: the
        run was stopped with it in flight)."""
        event = {"event": "released", "permit_id": permit_id, "row": row}
        if reason is not None:
            event["reason"] = reason
        self._write(event)

    def recorded(self, table: str, row: dict) -> None:
        """A row of one of the Gate's own tables (`JOURNALED_TABLES`), as it is made."""
        if table not in JOURNALED_TABLES:
            raise ValueError(f"table {table!r} is not journaled; journaled: {JOURNALED_TABLES}")
        self._write({"event": "row", "table": table, "row": row})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, event: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")


def read_events(path: Path) -> list[dict]:
    """A journal's events; a last line cut short by the kill is ignored."""
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def journaled_rows(events: Iterable[dict]) -> dict[str, list[dict]]:
    """The rows of each journaled table, in the order they were made. Pure."""
    tables: dict[str, list[dict]] = {t: [] for t in JOURNALED_TABLES}
    for e in events:
        if e.get("event") == "row" and e.get("table") in tables:
            tables[e["table"]].append(e["row"])
    return tables


def unrecorded_requests(
    run_id: str,
    events: Iterable[dict],
    recorded: set[str],
    finished_docs: set[str],
    killed: str = KILLED_IN_FLIGHT,
) -> list[dict]:
    """Request rows for what the journal saw and the requests table lacks.

    `recorded` holds the request ids already in the table; `finished_docs` the documents with an
    outcome. A permit released with its record becomes that record; one granted and never
    released (or released without a record, as an abort does) becomes a cancelled row from what
    the grant knew, its error `killed` for one never released (what ended the attempt, when the
    caller knows it), the release's reason for one released without a record. Pure: the caller reads the journal and writes the rows."""
    granted: dict[str, dict] = {}
    released: dict[str, dict | None] = {}
    reasons: dict[str, str] = {}
    for e in events:
        if e.get("event") == "granted":
            granted[e["permit_id"]] = e
        elif e.get("event") == "released":
            released[e["permit_id"]] = e.get("row")
            if e.get("reason"):
                reasons[e["permit_id"]] = e["reason"]
    rows = []
    for permit_id, grant in granted.items():
        row = released.get(permit_id)
        if row is not None:
            if row.get("request_id") in recorded:
                continue
            row = dict(row)
            if grant["doc_id"] in finished_docs:
                row["error"] = row.get("error") or RECOVERED
            else:
                row["error"] = KILLED_UNFINISHED.format(
                    doc_id=grant["doc_id"], status=row.get("status", "ok")
                )
                row["status"] = "cancelled"
            rows.append(row)
            continue
        rows.append(
            {
                "run_id": run_id,
                "request_id": permit_id,
                "class": "batch",
                "stage": grant.get("stage") or "whole",
                "replica": grant["replica"],
                "doc_id": grant["doc_id"],
                "prompt_tokens": grant.get("prompt_tokens"),
                "output_tokens": 0,
                "t_submit": grant["t"],
                "status": "cancelled",
                "error": reasons.get(permit_id)
                or (CANCELLED_IN_FLIGHT if permit_id in released else killed),
            }
        )
    return rows
