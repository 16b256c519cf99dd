"""The demo's two variants, `make demo` and `make demo-short`, and which engine config each runs here.

Pure: what a variant is, how the command line picks one, and the config and fit it takes on a host
with given CPU flags and fit files. `flows/demo.py` does the running.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from serving.cpu_features import float32_name

CONFIGS = Path("engine_configs")


@dataclass(frozen=True)
class Demo:
    """One night of the demo: a replica, its corpus, how documents are cut, and the deadline."""

    name: str
    """Run ids start with it, and the corpus goes under `results/<name>/`."""
    config: str
    """Engine config stem under `engine_configs/`; its fit is `fits/<stem>.json`. Its float32
    twin, for a CPU without native bf16, is `<stem>-fp32` (serving/cpu_features.py)."""
    docs: int
    min_tokens: int
    max_tokens: int
    pipeline: dict = field(default_factory=dict)
    """Settings over the engine config's default pipeline (`flows.nightly.default_pipeline`)."""
    summarize_s: float = 300.0
    """The night's deadline: documents not done by then are reported as stopped, not waited for."""
    itemized: bool = False
    """The morning report gives a row per SLO window and per document, and the replica's
    preemptions before and after: worth it where there are a handful of each."""


SHORT = Demo(
    name="demo-short",
    config="cpu-small",
    docs=16,
    min_tokens=1500,
    max_tokens=8000,
    pipeline={"mode": "map_reduce", "section_tokens": 1024},
)
"""`make demo-short`, in map-reduce sections: cpu-small's attention cost grows with a chunk's prefix ~25x
faster than a 70B replica's, so at the demo's tight SLO a chunk a few thousand tokens into a whole
document gets almost no step time and the demo would outlast its minutes. Whole documents at the
mission's scale run on the long-context stand-in, in `LONG`."""

LONG = Demo(
    name="demo",
    config="cpu-long",
    docs=3,
    min_tokens=78_000,
    max_tokens=82_000,
    pipeline={"mode": "whole"},
    itemized=True,
)
"""`make demo`, the mission's night: a handful of ~80k-token documents on cpu-long, each one
request, whole (a document too long for the context is failed, never cut). Three, so that the
whole demo, the replica's start included, stays within ten minutes on a 2-core host
(docs/results.md, "`make demo`")."""


class DemoRefused(ValueError):
    """This host cannot run the variant as it stands; the message says why and what to do."""


def parse_demo(argv: Sequence[str]) -> tuple[Demo, Path]:
    """The variant the command line asks for (`--short` for SHORT, nothing for LONG) and the
    folder its results go to."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.demo",
        description="Tonight's job on a local CPU replica beside chat, start to finish.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"{SHORT.docs} documents of {SHORT.min_tokens:,}-{SHORT.max_tokens:,} tokens in "
        f"map-reduce sections on {SHORT.config}, instead of {LONG.docs} of "
        f"{LONG.min_tokens:,}-{LONG.max_tokens:,} tokens, each summarized whole on {LONG.config}",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="folder for the corpus, the replica's state, the run and the DuckDB file "
        "(default: results)",
    )
    args = parser.parse_args(list(argv))
    return (SHORT if args.short else LONG), args.results


def host_config(
    demo: Demo, no_native_bf16: bool, exists: Callable[[Path], bool] = Path.exists
) -> tuple[Path, Path]:
    """The engine config and latency fit `demo` runs on this host: its bf16 config, or on a CPU
    without native bf16 its float32 twin (bf16 there runs several times slower than float32).

    The twin runs only with a fit of its own. The SLO controller prices every batch chunk with the
    fit, and the bf16 fit would price the slower float32 steps too cheap: the controller would
    grant chunks that break chat's SLO, the very thing the demo is there to show it does not do.
    Fitting takes a few minutes of its own and needs a quiet host, so rather than fit silently
    inside a ten-minute demo, a missing fit is refused with the command that makes it."""
    name = float32_name(demo.config) if no_native_bf16 else demo.config
    config, fit = CONFIGS / f"{name}.yaml", CONFIGS / "fits" / f"{name}.json"
    if not exists(fit):
        why = f" (no native bf16 here: {demo.config}'s float32 twin)" if no_native_bf16 else ""
        raise DemoRefused(
            f"{config}{why} has no latency fit: {fit} is missing, and the SLO controller prices "
            "every batch chunk with one. Fit it on this host (a few minutes; best on a quiet "
            f"host) with `.venv/bin/nightshift calibrate --engine-config {config} --out {fit}`, "
            "then run the demo again"
        )
    return config, fit
