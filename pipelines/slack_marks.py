"""Each replica's slack mark as the last run on it left it: where tonight's controller starts.

The slack mark (`scheduler/pressure_spread.py`) is learned from how much a replica's windows vary
at one step target: a property of the replica, its host and its chat, not of a run. A run that
started every replica at the configured prior would spend its first windows relearning what the
last night measured, growing on a margin the replica has already shown too thin (or too wide).
So a run starts each replica at the mark its last controlled decision recorded, in the same
results folder, under the same engine config (another model or flag set is another replica),
judged by the same pressures over windows of the same length: the spread is of a window's log
pressure, which does not move with the SLO's values, but a p99 read over shorter windows varies
more, and so does an E2E p99 read from a window's few finished answers against its many token
gaps.

Invariant: a mark returned is in (0, 1) and is the one with the latest decision time among the
runs read; a run whose files cannot be read is skipped with a warning, so a damaged old run
never stops a night (its replica starts at the prior instead).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from warehouse.run_files import RunFilesError, list_runs, read_meta, read_table, run_dir

log = logging.getLogger(__name__)


def last_slack_marks(
    results: str | Path, engine_config: str, replicas: Iterable[str], slo: Mapping[str, Any]
) -> dict[str, float]:
    """The latest recorded slack mark of each of `replicas` in the controlled runs under
    `results` of `engine_config` whose SLO (`RunMeta.slo`'s keys) reads the pressures `slo` does
    over windows as long, newest run first (an earlier attempt of a run being resumed is one of
    them); a replica no such run measured is left out."""
    wanted, marks = set(replicas), {}
    for run_id, directory in _controlled_runs_newest_first(
        results, engine_config, _spread_key(slo)
    ):
        try:
            rows = read_table(directory, "decisions").to_pylist()
        except (RunFilesError, OSError, ValueError) as err:
            log.warning("slack marks: skipped run %s (%s)", run_id, err)
            continue
        unknown = wanted - marks.keys()
        rows = [r for r in rows if r["replica"] in unknown and _usable(r)]
        for row in sorted(rows, key=lambda r: r["t"]):
            marks[row["replica"]] = row["slack_mark"]  # the run's latest wins
        if wanted <= marks.keys():
            break
    return marks


def _spread_key(slo: Mapping[str, Any]) -> tuple:
    """What a window's spread depends on: which pressures are read, and over how long."""
    pressures = ("chat_itl_p99_ms", "chat_ttft_p99_ms", "chat_e2e_p99_ms")
    return tuple(slo.get(k) is not None for k in pressures), slo.get("window_s")


def _controlled_runs_newest_first(results: str | Path, engine_config: str, spread_key: tuple):
    runs = []
    for run_id in list_runs(results):
        directory = run_dir(results, run_id)
        try:
            meta = read_meta(directory)
        except (RunFilesError, OSError, ValueError) as err:
            log.warning("slack marks: skipped run %s (%s)", run_id, err)
            continue
        same_spread = _spread_key(meta.slo) == spread_key
        if meta.engine_config == engine_config and meta.policy == "slo" and same_spread:
            runs.append((meta.started or 0.0, run_id, directory))
    return [(run_id, directory) for _, run_id, directory in sorted(runs, reverse=True)]


def _usable(row: dict) -> bool:
    mark = row["slack_mark"]  # null in runs before the column, or where no spread was kept
    return mark is not None and math.isfinite(mark) and 0 < mark < 1
