"""Does a batch chunk sized to a step target take that long on the GPU? The plug-in's sizing, checked.

Two halves, with a GPU between them (`bench.gpu_steps` times the steps there):

    python -m bench.gpu_sizing plan --fit FIT.json --out steps.jsonl
    python bench/gpu_steps.py --steps steps.jsonl --out DIR        # on the GPU
    python -m bench.gpu_sizing check --fit FIT.json --steps steps.jsonl --measured DIR/samples.jsonl

`plan` asks `scheduler.step_budget.size_batch_prefills`, the function the engine plug-in calls each
step, for the chunk one batch prompt gets at several prefix positions beside several chat loads and
step targets, and writes those steps. `check` sets each measured step beside its target: a fit that
sizes right puts every step at or just under its target, at every prefix position.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from scheduler.latency_model import LatencyModel
from scheduler.step import StepBatch
from scheduler.step_budget import BatchPrefill, size_batch_prefills

TARGETS_MS = (15, 20, 40, 80)
PREFIXES = (0, 15_600, 39_000, 78_000)
CHAT = ((0, 0), (16, 4096), (64, 4096))
"""Chat beside the batch prompt: (decoding sequences, context tokens each)."""
TOKEN_ROOM = 8192
BLOCK = 16
REMAINING = 80_000


@dataclass(frozen=True)
class Planned:
    target_ms: int
    decodes: int
    context: int
    chunk: int
    prefix: int

    def step(self) -> dict:
        return {
            "decodes": self.decodes,
            "context": self.context,
            "chunk": self.chunk,
            "prefix": self.prefix,
        }


def plan(model: LatencyModel) -> list[Planned]:
    """The chunk the plug-in's sizing grants at each (target, chat, prefix); steps granted no
    chunk (chat alone over the target) are left out: there is nothing of batch to time."""
    out = []
    for target_ms in TARGETS_MS:
        for decodes, context in CHAT:
            fixed = StepBatch((), decodes, decodes * context)
            for prefix in PREFIXES:
                [chunk] = size_batch_prefills(
                    model,
                    target_ms / 1000,
                    TOKEN_ROOM - decodes,
                    fixed,
                    [BatchPrefill(prefix, REMAINING)],
                    BLOCK,
                )
                if chunk:
                    out.append(Planned(target_ms, decodes, context, chunk, prefix))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write the steps the sizing picks")
    p.add_argument("--fit", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check", help="set measured steps beside their targets")
    c.add_argument("--fit", type=Path, required=True)
    c.add_argument("--steps", type=Path, required=True)
    c.add_argument(
        "--measured", type=Path, required=True, help="samples.jsonl from bench.gpu_steps --steps"
    )
    args = ap.parse_args(argv)

    model = LatencyModel.from_json(args.fit)
    planned = plan(model)
    if args.cmd == "plan":
        args.out.write_text("".join(json.dumps(p.step()) + "\n" for p in planned))
        print(f"wrote {len(planned)} steps to {args.out}")
        return 0
    steps = [json.loads(line) for line in args.steps.read_text().splitlines() if line.strip()]
    measured = [json.loads(line) for line in args.measured.read_text().splitlines() if line.strip()]
    if len(measured) != len(steps) or [p.step() for p in planned] != steps:
        raise SystemExit(
            f"{args.measured} does not hold the steps of {args.steps} planned from {args.fit}"
        )
    print("target ms  chat      prefix  chunk   measured ms  of target")
    for p, m in zip(planned, measured, strict=True):
        ms = 1000 * m["seconds"]
        chat = f"{p.decodes}x{p.context}" if p.decodes else "none"
        print(
            f"{p.target_ms:9d}  {chat:8s} {p.prefix:7d} {p.chunk:6d} {ms:12.1f} {ms / p.target_ms:9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
