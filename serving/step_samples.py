"""Measured engine steps on disk, beside the model fitted to them, so a model can be refitted (a new
formula, another prior, several sweeps pooled) without measuring a replica again.

`FIT.json` gets `FIT.samples.jsonl` beside it, one measured step per line:

    {"prefills": [[tokens, prefix_tokens], ...], "decode_seqs": B,
     "decode_context_tokens": X, "seconds": s, "stalled": false}

`stalled` records that the fit left the step out as slowed by other processes on the host; a refit
judges every step afresh, since a different model may explain it. JSON lines so that files of
several sweeps concatenate into one, and DuckDB (`read_json_auto`) or jq read them as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from scheduler.latency_fit import StepSample
from scheduler.step import PrefillChunk, StepBatch

SUFFIX = ".samples.jsonl"
"""What replaces a fit file's suffix to name its samples file."""


def samples_path(fit_path: str | Path) -> Path:
    """Where the samples of the model at `fit_path` go: FIT.json -> FIT.samples.jsonl."""
    return Path(fit_path).with_suffix(SUFFIX)


def step_row(sample: StepSample, stalled: bool = False) -> dict:
    """One step as a line of a samples file."""
    batch = sample.batch
    return {
        "prefills": [[c.tokens, c.prefix_tokens] for c in batch.prefills],
        "decode_seqs": batch.decode_seqs,
        "decode_context_tokens": batch.decode_context_tokens,
        "seconds": sample.seconds,
        "stalled": stalled,
    }


def write_samples(
    path: str | Path, kept: Iterable[StepSample], stalled: Iterable[StepSample]
) -> None:
    """Write every measured step: those fitted, then those left out as stalled."""
    rows = [step_row(s) for s in kept] + [step_row(s, stalled=True) for s in stalled]
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_samples(path: str | Path) -> list[StepSample]:
    """Every step of a samples file, stalled ones included. A fit file (FIT.json) is read too: the
    samples file it names, or the steps older fit files carried inline."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read step samples from {path}: {exc.strerror}") from None
    if path.suffix == ".json":
        return _from_fit_file(path, text)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    return [_sample(_json_line(line, path, n), f"{path} line {n}") for n, line in lines]


def _json_line(line: str, path: Path, n: int) -> object:
    try:
        return json.loads(line)
    except ValueError:
        raise ValueError(
            f"{path} line {n}: not JSON; a samples file has one step per line"
        ) from None


def _sample(row: object, where: str) -> StepSample:
    try:
        prefills = tuple(_chunk(c) for c in row["prefills"])
        batch = StepBatch(prefills, int(row["decode_seqs"]), int(row["decode_context_tokens"]))
        return StepSample(batch, float(row["seconds"]))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(
            f"{where}: not a step sample ({type(exc).__name__}: {exc}); a step needs "
            '"prefills": [[tokens, prefix_tokens], ...], "decode_seqs", '
            '"decode_context_tokens" and "seconds"'
        ) from None


def _chunk(chunk: object) -> PrefillChunk:
    """[tokens, prefix_tokens] in a samples file; a dict of both in fit files that carry steps."""
    if isinstance(chunk, dict):
        return PrefillChunk(int(chunk["tokens"]), int(chunk["prefix_tokens"]))
    tokens, prefix = chunk
    return PrefillChunk(int(tokens), int(prefix))


def _from_fit_file(path: Path, text: str) -> list[StepSample]:
    try:
        source = json.loads(text)["source"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}: not a latency model file with a source") from None
    if source.get("samples_file"):
        return read_samples(path.with_name(source["samples_file"]))
    rows = [*source.get("steps", []), *source.get("stalled_steps", [])]
    if not rows:
        raise ValueError(
            f"{path} carries no measured steps (a roofline prior, or fitted elsewhere); "
            f"pass the {SUFFIX} file its calibration wrote"
        )
    return [_sample(row, f"{path} step {n}") for n, row in enumerate(rows, 1)]
