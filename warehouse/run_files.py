"""A run's files on disk: `results/runs/<run_id>/` with one Parquet per table and `run.json`.

The directory is the hand-off between whoever produced the run (pipeline, simulator, benchmark) and
the warehouse: producers write here, `warehouse.load` reads from here, and nothing else is needed to
rebuild `nightshift.duckdb` from scratch. A table is `<name>.parquet`, optionally followed by parts
`<name>/*.parquet`, so a resumed run can append without rewriting what it already wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scheduler.run_schemas import REQUIRED, RUN_TABLES

RUN_JSON = "run.json"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SLO_DEFAULTS: dict[str, float | None] = {
    "chat_itl_p99_ms": 50.0,
    "chat_ttft_p99_ms": 1000.0,
    "window_s": 60.0,
    "chat_e2e_p99_ms": None,
}


class RunFilesError(ValueError):
    """A run directory or table that cannot be written or read; the message says what to fix."""


def _default_slo() -> dict[str, float | None]:
    return dict(SLO_DEFAULTS)


@dataclass
class RunMeta:
    """What `run.json` holds: everything about a run that is not a table row."""

    run_id: str
    """Unique name of the run; also its directory name under `results/runs/`."""
    engine_config: str = ""
    """Name of the engine config (replica class) the run used."""
    policy: str = ""
    """Admission policy that ran batch work (`slo`, `static`, `uncontrolled`, ...)."""
    hardware_count: int = 1
    """Devices (GPUs or CPU sockets) per replica, from the engine config."""
    replicas: int | None = None
    """Replicas the run used; None counts the distinct replicas in the request table."""
    hourly_usd: float = 0.0
    """Price of one replica-hour, all its devices included."""
    slo: dict[str, float | None] = field(default_factory=_default_slo)
    """Chat SLO in force: chat_itl_p99_ms, chat_ttft_p99_ms, window_s, chat_e2e_p99_ms."""
    started: float | None = None
    """Start of the run, epoch seconds; SLO windows count from here."""
    ended: float | None = None
    """End of the run, epoch seconds; throughput and cost divide by ended - started."""
    corpus_path: str = ""
    """Path of the corpus the run read."""
    corpus_fingerprint: str = ""
    """Digest of the corpus file, so a resumed run can refuse a different corpus."""

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        unknown = set(self.slo) - set(SLO_DEFAULTS)
        if unknown:
            raise RunFilesError(
                f"run {self.run_id}: unknown SLO key(s) {sorted(unknown)}; "
                f"use only {sorted(SLO_DEFAULTS)}"
            )
        self.slo = {**SLO_DEFAULTS, **self.slo}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping, source: str = RUN_JSON) -> RunMeta:
        """Build from parsed JSON; unknown keys fail with their names, as engine configs do."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise RunFilesError(
                f"{source}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        if "run_id" not in data:
            raise RunFilesError(f"{source}: missing 'run_id'")
        return cls(**data)


def check_run_id(run_id: str) -> str:
    """A run id doubles as a directory name, so it must be a plain file name."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise RunFilesError(
            f"run id {run_id!r} is not usable as a directory name: use letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return run_id


def run_dir(results: Path | str, run_id: str) -> Path:
    """Where run `run_id` keeps its files under a results directory."""
    return Path(results) / "runs" / check_run_id(run_id)


def list_runs(results: Path | str) -> list[str]:
    """Run ids that have a `run.json` under `results/runs/`, sorted by name."""
    runs = Path(results) / "runs"
    if not runs.is_dir():
        return []
    return sorted(p.parent.name for p in runs.glob(f"*/{RUN_JSON}"))


def write_meta(directory: Path | str, meta: RunMeta) -> Path:
    """Write `run.json` atomically, so a reader never sees half a file."""
    path = Path(directory) / RUN_JSON
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(meta.to_dict(), indent=2) + "\n"))
    return path


def read_meta(directory: Path | str) -> RunMeta:
    """Read and validate `run.json` of a run directory."""
    path = Path(directory) / RUN_JSON
    if not path.is_file():
        raise RunFilesError(
            f"no {RUN_JSON} in {directory}: not a run directory; point at results/runs/<run_id>"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RunFilesError(f"{path}: not valid JSON ({err}); rewrite it or rerun the run") from err
    return RunMeta.from_dict(data, source=str(path))


def conform(name: str, data: pa.Table | Iterable[Mapping], run_id: str | None = None) -> pa.Table:
    """Rows or an Arrow table as table `name` in its exact schema (column order, types).

    Columns a producer left out become null, unless the schema requires them. With `run_id`, a
    missing run_id column is filled in (token gaps carry none of their own) and a different one is
    refused, so one run's files never hold another's rows.
    """
    schema = _schema(name)
    table = data if isinstance(data, pa.Table) else _from_rows(name, list(data))
    unknown = set(table.column_names) - set(schema.names)
    if unknown:
        raise RunFilesError(
            f"table {name}: unknown column(s) {sorted(unknown)}; known: {schema.names}"
        )
    if run_id is not None and "run_id" not in table.column_names:
        table = table.append_column("run_id", pa.array([run_id] * table.num_rows, pa.string()))
    columns = [_column(name, table, f) for f in schema]
    out = pa.Table.from_arrays(columns, schema=schema)
    if run_id is not None:
        _check_single_run(name, out, run_id)
    return out


def write_table(
    directory: Path | str,
    name: str,
    data: pa.Table | Iterable[Mapping],
    *,
    run_id: str | None = None,
    part: str | None = None,
) -> Path:
    """Write table `name` of a run: `<name>.parquet`, or part `<name>/<part>.parquet` to append."""
    table = conform(name, data, run_id=run_id)
    directory = Path(directory)
    if part is None:
        path = directory / f"{name}.parquet"
    else:
        check_run_id(part)  # same rule: a plain file name
        path = directory / name / f"{part}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


def table_files(directory: Path | str, name: str) -> list[Path]:
    """The Parquet files that make up table `name` of a run, the main file first."""
    directory = Path(directory)
    main = directory / f"{name}.parquet"
    parts = sorted((directory / name).glob("*.parquet")) if (directory / name).is_dir() else []
    return ([main] if main.is_file() else []) + parts


def read_table(directory: Path | str, name: str, run_id: str | None = None) -> pa.Table:
    """Table `name` of a run in its schema; a table the run never wrote reads as empty."""
    schema = _schema(name)
    tables = [conform(name, pq.read_table(p), run_id=run_id) for p in table_files(directory, name)]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def check_table_files(directory: Path | str, name: str) -> list[Path]:
    """The files of table `name`, after checking from their Parquet footers alone that every
    column is known, required ones are present, and types fit; a loader can then stream the rows
    without holding the table in memory."""
    schema = _schema(name)
    files = table_files(directory, name)
    for path in files:
        found = pq.read_schema(path)
        unknown = set(found.names) - set(schema.names)
        if unknown:
            raise RunFilesError(
                f"{path}: unknown column(s) {sorted(unknown)}; known: {schema.names}"
            )
        missing = REQUIRED[name] - set(found.names)
        if missing:
            raise RunFilesError(f"{path}: required column(s) {sorted(missing)} missing; rewrite it")
        for f in found:
            want = schema.field(f.name).type
            if _family(f.type) not in (_family(want), "null"):
                raise RunFilesError(
                    f"{path}: column {f.name!r} is {f.type}, the warehouse needs {want}; "
                    "write the table with warehouse.run_files.write_table"
                )
    return files


def corpus_fingerprint(path: Path | str, chunk_bytes: int = 1 << 20) -> str:
    """`sha256:<hex>` of a corpus file's bytes: cheap next to the run, exact about the input."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def _schema(name: str) -> pa.Schema:
    if name not in RUN_TABLES:
        raise RunFilesError(f"unknown table {name!r}; a run has {sorted(RUN_TABLES)}")
    return RUN_TABLES[name]


def _from_rows(name: str, rows: list[Mapping]) -> pa.Table:
    schema = _schema(name)
    seen = set().union(*(r.keys() for r in rows)) if rows else set()
    unknown = seen - set(schema.names)
    if unknown:
        raise RunFilesError(
            f"table {name}: unknown column(s) {sorted(unknown)}; known: {schema.names}"
        )
    present = [f for f in schema if f.name in seen]
    return pa.Table.from_pylist([dict(r) for r in rows], schema=pa.schema(present))


def _column(name: str, table: pa.Table, f: pa.Field) -> pa.ChunkedArray | pa.Array:
    if f.name not in table.column_names:
        if f.name in REQUIRED[name]:
            raise RunFilesError(f"table {name}: required column {f.name!r} is missing")
        return pa.nulls(table.num_rows, f.type)
    col = table.column(f.name)
    if f.name in REQUIRED[name] and col.null_count:
        raise RunFilesError(f"table {name}: column {f.name!r} has {col.null_count} null value(s)")
    try:
        return col.cast(f.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise RunFilesError(
            f"table {name}: column {f.name!r} is {col.type}, cannot become {f.type} ({err})"
        ) from err


def _family(t: pa.DataType) -> str:
    """Coarse type family: values of one family convert into each other on load."""
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return "list"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def _check_single_run(name: str, table: pa.Table, run_id: str) -> None:
    col = table.column("run_id")
    if table.num_rows and not pc.all(pc.equal(col, run_id)).as_py():
        others = sorted(set(pc.unique(col).to_pylist()) - {run_id})
        raise RunFilesError(
            f"table {name}: rows of run(s) {others[:3]} in the files of run {run_id}; "
            "write each run under its own directory"
        )


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
