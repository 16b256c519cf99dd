"""The corpus: reading it, refusing a file that cannot be a corpus, and judging each document.

Two kinds of bad input are told apart on purpose. A file that cannot be a corpus at all (missing,
wrong format, no `doc_id` or `text`, empty) raises `CorpusError` before any work starts, because
nothing useful can come of the run. A bad *document* (a line that is not JSON, empty or non-UTF-8
text, an over-long or duplicated document) is only a row with a problem: the run records it with a
reason and goes on, so one broken line never costs a night's work.

The table `read_corpus` returns has four columns:

- `doc_id` (string): the document's id; `line-N` (JSONL, 1-based) or `row-K` (Parquet, 0-based)
  when the input had none.
- `text` (string, or binary when some text is not valid UTF-8, so the raw bytes survive for the
  per-document check instead of crashing the reader).
- `meta` (string, JSON object or null): the `meta` field merged with any other fields of the input.
- `problem` (string or null): why the reader could not make a document of this row.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
REQUIRED_COLUMNS = ("doc_id", "text")
COLUMNS = ("doc_id", "text", "meta", "problem")


class CorpusError(ValueError):
    """A corpus file that cannot be read as a corpus; the message names the problem and the fix."""


@dataclass(frozen=True)
class DocProblem:
    """Why one document is not summarized: `failed` (bad input) or `skipped` (a copy of another)."""

    status: Literal["failed", "skipped"]
    reason: str


def corpus_format(path: Path | str) -> Literal["parquet", "jsonl"]:
    """The format a corpus path names by its extension."""
    name = Path(path).name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    supported = ", ".join(PARQUET_SUFFIXES + JSONL_SUFFIXES)
    raise CorpusError(
        f"corpus {path}: unsupported extension; a corpus is Parquet or JSONL, named with one of "
        f"{supported} (rename the file or convert it)"
    )


def read_corpus(path: Path | str) -> pa.Table:
    """Read a Parquet or JSONL corpus into the four-column table described in the module docstring.

    Raises `CorpusError` for a file that is missing, of an unsupported kind, without `doc_id` or
    `text`, or without any document; every other defect is left to the row's `problem`."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(
            f"corpus {path} does not exist: check the path (relative to {Path.cwd()})"
        )
    if path.is_dir():
        raise CorpusError(f"corpus {path} is a directory: pass one .parquet or .jsonl file")
    fmt = corpus_format(path)
    if path.stat().st_size == 0:
        raise CorpusError(f"corpus {path} is empty (0 bytes): write documents into it first")
    table = _read_parquet(path) if fmt == "parquet" else _read_jsonl(path)
    if table.num_rows == 0:
        raise CorpusError(f"corpus {path} holds no documents: write documents into it first")
    return table


# --- Parquet ---------------------------------------------------------------------------------------


def _read_parquet(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        raw = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(
            f"corpus {path} is not a readable Parquet file ({exc}): "
            "check that it was written as Parquet, or give it a .jsonl name"
        ) from None
    _require_columns(path, raw.column_names)
    raw = pa.table({name: _checked(raw.column(name)) for name in raw.column_names})
    doc_ids, problems = _parquet_doc_ids(raw.column("doc_id"))
    return _table(doc_ids, _parquet_text(path, raw.column("text")), _parquet_meta(raw), problems)


def _checked(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A string column holding invalid UTF-8 as bytes: Parquet readers do not validate strings,
    and converting such a column to Python would raise in the middle of a run."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return column
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return column.cast(
            pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        )
    return column


def _parquet_doc_ids(column: pa.ChunkedArray) -> tuple[list[str], list[str | None]]:
    ids: list[str] = []
    problems: list[str | None] = []
    for k, value in enumerate(column.to_pylist()):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                ids.append(f"row-{k}")
                problems.append(f"doc_id in row {k} is not valid UTF-8")
                continue
        ids.append(f"row-{k}" if value is None else str(value))
        problems.append(f"row {k} has no doc_id" if value is None else None)
    return ids, problems


def _parquet_text(path: Path, column: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A string column as it is; a binary one as strings when it all decodes, else as bytes."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.string())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return _text_array(column.to_pylist())
    raise CorpusError(
        f"corpus {path}: column `text` has type {column.type}; store the documents' "
        "text as strings (or bytes)"
    )


def _parquet_meta(raw: pa.Table) -> list[str | None]:
    """`meta` merged with every column beyond doc_id/text, one JSON object per row."""
    extra = [c for c in raw.column_names if c not in REQUIRED_COLUMNS]
    if not extra:
        return [None] * raw.num_rows
    rows = raw.select(extra).to_pylist()
    return [_meta_json(row.pop("meta", None), row) for row in rows]


# --- JSONL -----------------------------------------------------------------------------------------


@dataclass
class _Line:
    """One parsed JSONL line; `text` is the raw UTF-8 bytes, or None when there is none."""

    doc_id: str
    text: bytes | None
    meta: str | None
    problem: str | None
    keys: tuple[str, ...] | None = None
    """The object's fields; None when the line is not a JSON object."""


def _read_jsonl(path: Path) -> pa.Table:
    lines = list(_jsonl_lines(path))
    if lines and all(line.keys is None for line in lines):
        raise CorpusError(
            f"corpus {path}: no line is a JSON object (first: {lines[0].problem}); "
            "a JSONL corpus holds one object per line"
        )
    keys = {k for line in lines for k in line.keys or ()}
    if lines:
        _require_columns(path, sorted(keys))
    return _table(
        [x.doc_id for x in lines],
        _text_array([x.text for x in lines]),
        [x.meta for x in lines],
        [x.problem for x in lines],
    )


def _jsonl_lines(path: Path) -> Iterator[_Line]:
    """Bytes line by line, so an invalid UTF-8 sequence stays inside its own document."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                if raw.strip():
                    yield _parse_line(n, raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorpusError(
            f"corpus {path} could not be read ({exc}): check that a .gz name "
            "holds gzip data and that the file is complete"
        ) from None


def _parse_line(n: int, raw: bytes) -> _Line:
    # surrogateescape keeps undecodable bytes as lone surrogates, so json still parses the line
    # and the bytes can be restored exactly for the UTF-8 check.
    try:
        obj = json.loads(raw.decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as exc:
        return _Line(
            f"line-{n}", None, None, f"line {n} is not valid JSON: {exc.msg} (column {exc.colno})"
        )
    if not isinstance(obj, dict):
        return _Line(
            f"line-{n}", None, None, f"line {n} is a JSON {type(obj).__name__}, not an object"
        )
    keys = tuple(obj)
    doc_id, id_problem = _line_doc_id(n, obj.pop("doc_id", None))
    text, text_problem = _line_text(obj.pop("text", None), "text" in keys)
    meta = _meta_json(obj.pop("meta", None), obj)
    return _Line(doc_id, text, meta, id_problem or text_problem, keys)


def _line_doc_id(n: int, value: object) -> tuple[str, str | None]:
    if isinstance(value, str):
        if _is_clean(value):
            return value, None
        return f"line-{n}", f"doc_id on line {n} is not valid UTF-8"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value), None
    if value is None:
        return f"line-{n}", f"line {n} has no doc_id"
    return f"line-{n}", f"doc_id on line {n} is a {type(value).__name__}, not a string"


def _line_text(value: object, present: bool) -> tuple[bytes | None, str | None]:
    if isinstance(value, str):
        return _raw_bytes(value), None
    if value is None and present:
        return None, None  # an explicit null: classify reports it as missing text
    if value is None:
        return None, "no text field"
    return None, f"text is a JSON {type(value).__name__}, not a string"


def _raw_bytes(s: str) -> bytes:
    """The bytes a JSON string stood for; lone surrogates from `\\udXXX` escapes included."""
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass")


def _is_clean(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- shared by both formats ------------------------------------------------------------------------


def _require_columns(path: Path, found: Sequence[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in found]
    if missing:
        has = ", ".join(found[:20]) + (" ..." if len(found) > 20 else "") if found else "none"
        raise CorpusError(
            f"corpus {path} has no {' or '.join(f'`{c}`' for c in missing)} column (columns: "
            f"{has}): every document needs `doc_id` and `text`; rename the columns or fields"
        )


def _meta_json(meta: object, extra: dict) -> str | None:
    """One JSON object from a `meta` value (object, JSON string or scalar) and the other fields."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            pass
    base = meta if isinstance(meta, dict) else ({} if meta is None else {"meta": meta})
    merged = {**base, **extra}
    # ASCII escapes keep lone surrogates out of the Arrow string column.
    return json.dumps(merged, default=str) if merged else None


def _text_array(values: Sequence[bytes | str | None]) -> pa.Array:
    """Strings when every text decodes, else bytes for all rows (an Arrow column has one type)."""
    raw = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    try:
        return pa.array([None if v is None else v.decode("utf-8") for v in raw], pa.string())
    except UnicodeDecodeError:
        return pa.array(raw, pa.binary())


def _table(
    doc_ids: list[str],
    text: pa.Array | pa.ChunkedArray,
    meta: list[str | None],
    problems: list[str | None],
) -> pa.Table:
    return pa.table(
        {
            "doc_id": pa.array(doc_ids, pa.string()),
            "text": text,
            "meta": pa.array(meta, pa.string()),
            "problem": pa.array(problems, pa.string()),
        }
    )


# --- per-document checks ---------------------------------------------------------------------------


def document_texts(table: pa.Table) -> list[str | None]:
    """Each row's text as a string; None when it is missing or not valid UTF-8."""
    return [_decoded(v) for v in table.column("text").to_pylist()]


def count_tokens(table: pa.Table, tokenizer) -> list[int | None]:
    """Token counts with the served model's tokenizer; None for rows without usable text.

    Uses `encode_batch` when the tokenizer has it (the local one does, in parallel threads)."""
    texts = document_texts(table)
    todo = [i for i, t in enumerate(texts) if t is not None and t.strip()]
    batch = [texts[i] for i in todo]
    if hasattr(tokenizer, "encode_batch"):
        encoded = tokenizer.encode_batch(batch)
    else:
        encoded = [tokenizer.encode(t) for t in batch]
    counts: list[int | None] = [None] * len(texts)
    for i, ids in zip(todo, encoded, strict=True):
        counts[i] = len(ids)
    return counts


def classify(
    table: pa.Table, max_doc_tokens: int | None, token_counts: Sequence[int | None]
) -> list[DocProblem | None]:
    """For each row, None when the document is fine, else why it is failed or skipped. Pure.

    Checks run in this order and the first that applies wins: a reader problem, missing text,
    invalid UTF-8, empty text (failed); a doc_id already seen (skipped: the first row with an id is
    the document, whatever became of it); more than `max_doc_tokens` tokens (failed; None means no
    limit); the same text as an earlier accepted document (skipped). `token_counts` comes from the
    caller (`count_tokens`), so this function needs no tokenizer; a None count is not checked."""
    if len(token_counts) != table.num_rows:
        raise ValueError(
            f"token_counts has {len(token_counts)} entries for {table.num_rows} rows: "
            "pass one count (or None) per row, e.g. from count_tokens(table, ...)"
        )
    ids = table.column("doc_id").to_pylist()
    texts = table.column("text").to_pylist()
    read_problems = table.column("problem").to_pylist()
    first_row: dict[str, int] = {}
    first_doc: dict[bytes, str] = {}  # sha256 of the text -> first doc_id
    out: list[DocProblem | None] = []
    for row, (doc_id, text, problem) in enumerate(zip(ids, texts, read_problems, strict=True)):
        if problem is not None:
            out.append(DocProblem("failed", problem))
            continue
        out.append(
            _check_one(row, doc_id, text, token_counts[row], max_doc_tokens, first_row, first_doc)
        )
    return out


def _check_one(
    row: int,
    doc_id: str,
    text: str | bytes | None,
    tokens: int | None,
    limit: int | None,
    first_row: dict[str, int],
    first_doc: dict[bytes, str],
) -> DocProblem | None:
    """One row's verdict; records the row in `first_row` / `first_doc` as later rows need."""
    seen_at = first_row.setdefault(doc_id, row)
    if text is None:
        return DocProblem("failed", "missing text")
    raw = text.encode("utf-8") if isinstance(text, str) else text
    bad_byte = _utf8_error_at(raw)
    if bad_byte is not None:
        return DocProblem("failed", f"text is not valid UTF-8 (byte {bad_byte})")
    if not raw.decode("utf-8").strip():
        return DocProblem("failed", "empty text")
    if seen_at != row:
        return DocProblem("skipped", f"duplicate doc_id (first at row {seen_at})")
    if limit is not None and tokens is not None and tokens > limit:
        return DocProblem("failed", over_long_reason(tokens, limit))
    original = first_doc.setdefault(hashlib.sha256(raw).digest(), doc_id)
    if original != doc_id:
        return DocProblem("skipped", f"same text as doc {original}")
    return None


def over_long_reason(tokens: int, limit: int) -> str:
    """Why a document of `tokens` tokens over `max_doc_tokens` = `limit` is failed, and the fix."""
    return (
        f"over-long: {tokens} tokens > limit {limit}; raise max_doc_tokens or split the "
        "document upstream"
    )


def _utf8_error_at(raw: bytes) -> int | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None


def _decoded(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value
