"""Options every command spells the same way, and the one writer behind `--json PATH`.

One vocabulary across the command line: `--engine-config PATH`, `--policy none|static|budget|slo`,
`--json PATH` (`-` for stdout), replicas started on the first free ports from
`serving.launcher.DEFAULT_PORT`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

JSON_STDOUT = Path("-")

JsonOut = Annotated[
    Path | None,
    typer.Option("--json", help="Write the result as JSON to this file; - for stdout."),
]
PolicyOption = Annotated[
    str,
    typer.Option(
        "--policy",
        "--controller",
        help="Admission policy: none (stock engine, batch at full concurrency), static (fixed "
        "seats and chunk), budget (the plug-in at a fixed batch step target) or slo (the "
        "controller steers the plug-in).",
    ),
]
"""`--controller` is the older spelling of `simulate --policy`, kept because it costs nothing."""


def write_json(path: Path | None, data: Any) -> bool:
    """Write `data` as indented JSON to `path` (`-`: stdout); True when it went to stdout, so the
    caller keeps its human summary off stdout and the JSON stays parseable."""
    if path is None:
        return False
    text = json.dumps(data, indent=2) + "\n"
    if path == JSON_STDOUT:
        sys.stdout.write(text)
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return False
