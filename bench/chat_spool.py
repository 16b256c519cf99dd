"""Chat records written to their run directory as requests end, not held until the run ends.

A chat load that runs all night would otherwise keep every record and token gap in memory and
write them only at its end, so it grew with the night and a kill lost all of them. The spool
writes the `requests` and `token_gaps` tables as numbered parts (`requests/chat-00001.parquet`,
...) that the warehouse reads as one table (`warehouse.run_files.read_table`). Memory holds at most
`rows_per_part` records; a kill loses at most those. A new spool in a directory replaces the parts
an earlier run left there, as writing the tables whole did.

The Parquet writer is imported with this module, so the memory its libraries take is there when
the run starts rather than appearing at the first part, minutes in, as if the run had grown.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from scheduler.records import RequestRecord
from warehouse.run_files import write_table  # at start-up, not at the first part: see below

ROWS_PER_PART = 500
"""Records a part holds: at the chat rates of a night (0.5-2 requests/s) one part every few
minutes, a few hundred parts at most in a night, each well past Parquet's per-file overhead."""


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
        write_table(self.directory, "token_gaps", gaps, run_id=self.run_id, part=part)
        rows = [r.row() for r in self._records]
        write_table(self.directory, "requests", rows, run_id=self.run_id, part=part)
        self.parts += 1
        self.written += len(self._records)
        self._records = []
