"""Chat records written to their run directory as requests end, not held until the run ends.

A chat load that runs all night would otherwise keep every record and token gap in memory and
write them only at its end, so it grew with the night and a kill lost all of them. The spool
writes the `requests` and `token_gaps` tables as numbered parts (`requests/chat-00001.parquet`,
...) that the warehouse reads as one table (`warehouse.run_files.read_table`). Memory holds at most
`rows_per_part` records; a kill loses at most those. A new spool in a directory replaces the parts
an earlier run left there, as writing the tables whole did.

A new spool writes one stand-in record to Parquet in memory and throws it away: Arrow's first
conversion and Parquet's first write in a process take some 45 MiB that stay (measured: 72 -> 117
MiB), and taken at the first part, minutes into a night, they would read as the run growing.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from scheduler.records import RequestRecord, TokenGap
from warehouse.run_files import conform, write_table

ROWS_PER_PART = 100
"""Records a part holds. Building a part's rows takes memory that the process keeps once taken
(measured: about 5 MiB for 100 records of 40 tokens, 14 MiB for 500), so parts stay small; at the
chat rates of a night (0.5-2 requests/s) that is a part a minute or so, a few hundred a night."""


PART_PREFIX = "chat-"


class RecordSpool:
    """Appends finished records to run directory `directory` in parts of `rows_per_part`."""

    def __init__(
        self, directory: Path | str, run_id: str, rows_per_part: int = ROWS_PER_PART
    ) -> None:
        if rows_per_part < 1:
            raise ValueError(f"rows_per_part must be at least 1, got {rows_per_part}")
        self.directory, self.run_id, self.rows_per_part = Path(directory), run_id, rows_per_part
        self._records: list[RequestRecord] = []
        self.parts = 0
        self.written = 0
        for table in ("requests", "token_gaps"):  # a run before in this directory: replaced
            for stale in (self.directory / table).glob(f"{PART_PREFIX}*.parquet"):
                stale.unlink()
        _warm_up(run_id)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)
        if len(self._records) >= self.rows_per_part:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as the next part; nothing when the buffer is empty."""
        if not self._records:
            return
        part = f"{PART_PREFIX}{self.parts + 1:05d}"
        gaps = [asdict(g) for r in self._records for g in r.gaps]
        if gaps:  # none where every request of the part failed before its second token
            write_table(self.directory, "token_gaps", gaps, run_id=self.run_id, part=part)
        rows = [r.row() for r in self._records]
        write_table(self.directory, "requests", rows, run_id=self.run_id, part=part)
        self.parts += 1
        self.written += len(self._records)
        self._records = []


def _warm_up(run_id: str) -> None:
    """Write a stand-in row of each table to Parquet in memory (see the module's docstring)."""
    stand_in = RequestRecord(run_id, "stand-in", "chat", "chat", "-")
    rows = {"requests": stand_in.row(), "token_gaps": asdict(TokenGap("-", 0, 0.0, 0.0))}
    for table, row in rows.items():
        arrow = conform(table, [row], run_id=run_id)
        pq.write_table(arrow, pa.BufferOutputStream(), compression="zstd")
