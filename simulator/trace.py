"""Chat arrival traces in the public Azure LLM inference trace format, and their rescaling.

A trace is a CSV `TIMESTAMP,ContextTokens,GeneratedTokens`: one row per request, with the prompt size
and the answer size production saw. Replaying it keeps production's burstiness and its size mix,
which a Poisson process with fixed sizes does not. The published traces ran on large GPU fleets, so a
replay here usually needs its clock stretched or compressed (`speedup`, or a target mean `rate`) and
its token sizes shrunk to what the engine holds (`token_scale`).

This module is the one reader of the format: the simulator replays its rows in virtual time, and
the real chat load (`bench/chat_load_run.py`) sends them to a replica, so both see the same rows
and refuse a bad file with the same message (file:line, what is wrong). It sits in the simulator, the
lower of its two users' layers: `bench` may import the simulator, never the other way round.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")
_EPOCH = datetime(1970, 1, 1)


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and the fix."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace."""

    t_s: float
    """Arrival, seconds after the trace's first request."""
    context_tokens: int
    """Prompt size production saw, in tokens."""
    generated_tokens: int
    """Answer size production saw, in tokens."""
    line: int = 0
    """Line of the CSV the row came from, so later complaints can point at it."""


def read_trace(path: str | Path) -> list[TraceRow]:
    """Rows of a trace CSV file, sorted by arrival, times relative to the earliest row."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(
            f"{path}: no such trace file; pass a TIMESTAMP,ContextTokens,GeneratedTokens CSV"
        )
    with path.open(newline="", encoding="utf-8-sig") as fh:
        return parse_trace(fh, source=str(path))


def parse_trace(lines: Iterable[str], source: str = "trace") -> list[TraceRow]:
    """Parse CSV text. The header is optional; when present it may order the columns freely and
    carry more columns than the three (they are ignored). Without it a row is exactly the three."""
    reader = csv.reader(lines)
    order: tuple[int, int, int] = (0, 1, 2)
    named = False
    parsed: list[tuple[float, int, int, int]] = []
    kind: str | None = None
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if not parsed and kind is None and _is_header(cells):
            order = _column_order(cells, source, line)
            named, kind = True, "header"
            continue
        t, row_kind, ctx, gen = _parse_row(cells, order, named, source, line)
        if kind not in (None, "header", row_kind):
            raise TraceError(
                f"{source}:{line}: TIMESTAMP is {row_kind} but earlier rows are "
                f"{kind}; use one TIMESTAMP format for the whole file"
            )
        kind = row_kind
        parsed.append((t, ctx, gen, line))
    if not parsed:
        raise TraceError(
            f"{source}: no request rows; a trace needs at least one "
            "TIMESTAMP,ContextTokens,GeneratedTokens row"
        )
    parsed.sort(key=lambda r: r[0])  # merged traces are not always in order
    t0 = parsed[0][0]
    return [TraceRow(t - t0, ctx, gen, line) for t, ctx, gen, line in parsed]


def scale_trace(
    rows: Sequence[TraceRow],
    *,
    speedup: float | None = None,
    rate: float | None = None,
    token_scale: float = 1.0,
    start_s: float = 0.0,
) -> list[TraceRow]:
    """The trace from `start_s` on, its clock compressed by `speedup` or stretched to a mean `rate`
    (requests/s), and both token columns multiplied by `token_scale` (at least one token each)."""
    if speedup is not None and rate is not None:
        raise TraceError("give a speed-up or a target rate for the trace, not both")
    if speedup is not None and not (speedup > 0 and math.isfinite(speedup)):
        raise TraceError(f"trace speed-up must be a positive number, got {speedup}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise TraceError(f"trace rate must be positive requests/s, got {rate}")
    if not token_scale > 0:
        raise TraceError(f"token scale must be positive, got {token_scale}")
    window = [r for r in rows if r.t_s >= start_s]
    if not window:
        raise TraceError(f"the trace has no rows after {start_s:g} s; lower the start offset")
    t0 = window[0].t_s
    factor = 1.0 / speedup if speedup is not None else 1.0
    if rate is not None:
        factor = _rate_factor(window, t0, rate)
    return [
        replace(
            r,
            t_s=(r.t_s - t0) * factor,
            context_tokens=max(1, round(r.context_tokens * token_scale)),
            generated_tokens=max(1, round(r.generated_tokens * token_scale)),
        )
        for r in window
    ]


def covering_s(rows: Sequence[TraceRow]) -> float:
    """Seconds from 0 that cover every arrival of sorted `rows`: the last one's in whole seconds,
    plus one, so that arrival falls inside a run of that length (a replay stops taking arrivals
    at its duration)."""
    if not rows:
        raise TraceError("an empty trace covers no time; a trace needs at least one row")
    return float(int(rows[-1].t_s) + 1)


def mean_rate(rows: Sequence[TraceRow]) -> float:
    """Requests per second over the trace's span: (n - 1) gaps in (last - first) seconds."""
    if len(rows) < 2:
        return 0.0
    span = rows[-1].t_s - rows[0].t_s
    return (len(rows) - 1) / span if span > 0 else math.inf


def _rate_factor(window: Sequence[TraceRow], t0: float, rate: float) -> float:
    span = window[-1].t_s - t0
    if len(window) < 2 or span <= 0:
        raise TraceError(
            "a target rate needs a trace with at least two distinct arrival times; "
            "use a speed-up instead"
        )
    return (len(window) - 1) / span / rate


def _is_header(cells: list[str]) -> bool:
    return any(c.strip().lower() in {n.lower() for n in COLUMNS} for c in cells)


def _column_order(cells: list[str], source: str, line: int) -> tuple[int, int, int]:
    names = [c.strip().lower() for c in cells]
    missing = [n for n in COLUMNS if n.lower() not in names]
    if missing:
        raise TraceError(
            f"{source}:{line}: header lacks {', '.join(missing)}; expected {','.join(COLUMNS)}"
        )
    idx = [names.index(n.lower()) for n in COLUMNS]
    return idx[0], idx[1], idx[2]


def _parse_row(
    cells: list[str], order: tuple[int, int, int], named: bool, source: str, line: int
) -> tuple[float, str, int, int]:
    if len(cells) <= max(order) or (not named and len(cells) != len(COLUMNS)):
        raise TraceError(
            f"{source}:{line}: expected {len(COLUMNS)} columns "
            f"({','.join(COLUMNS)}), got {len(cells)}: {','.join(cells)}"
        )
    stamp, ctx_text, gen_text = (cells[i].strip() for i in order)
    try:
        t, kind = parse_timestamp(stamp)
    except ValueError as exc:
        raise TraceError(f"{source}:{line}: {exc}") from None
    ctx = _count(ctx_text, "ContextTokens", source, line)
    gen = _count(gen_text, "GeneratedTokens", source, line)
    if ctx < 1:
        raise TraceError(f"{source}:{line}: ContextTokens is {ctx}; a prompt has at least 1 token")
    return t, kind, ctx, gen


def _count(text: str, column: str, source: str, line: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{source}:{line}: {column} {text!r} is not a whole number") from None
    if value < 0:
        raise TraceError(f"{source}:{line}: {column} is negative ({value})")
    return value


def parse_timestamp(text: str) -> tuple[float, str]:
    """Seconds, and which kind of stamp it was: plain seconds, or a `YYYY-MM-DD HH:MM:SS.fffffff`
    datetime (the Azure traces carry 7 fractional digits, more than `datetime` keeps, so the
    fraction is read separately and none of it is lost)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value):
            raise ValueError(f"TIMESTAMP {text!r} is not a finite number of seconds")
        return value, "seconds"
    m = _DATETIME.match(text)
    if not m:
        raise ValueError(f"TIMESTAMP {text!r} is neither seconds nor 'YYYY-MM-DD HH:MM:SS.f'")
    try:
        whole = datetime.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise ValueError(f"TIMESTAMP {text!r} is not a valid date and time ({exc})") from None
    fraction = float(f"0.{m[3]}") if m[3] else 0.0
    return (whole - _EPOCH).total_seconds() + fraction, "datetime"
