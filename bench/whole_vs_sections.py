"""Batch tokens per second of step time for one document beside a fixed chat load: whole, or in
map-reduce sections, at a few batch step targets, priced with an engine profile's step-time model
through the plug-in's own sizing (`scheduler.step_budget.size_batch_prefills`).

Why: a chunk deep in a long prompt pays attention over its whole prefix, so the same step time
buys fewer batch tokens in a whole 80k document than in short sections; this prices by how much,
which bounds any comparison of a controller sending documents whole with caps that cut them.

    .venv/bin/python -m bench.whole_vs_sections --targets 40,47,50
    .venv/bin/python -m bench.whole_vs_sections --engine-config engine_configs/cpu-small-fp32.yaml \
        --targets 47,64 --doc-tokens 6300 --section-tokens 1024 --chat-decodes 4 --chat-context 930
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.step import PrefillChunk, StepBatch, StepTimeModel
from scheduler.step_budget import BatchPrefill, size_batch_prefills

PROFILE = Path(__file__).resolve().parents[1] / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"


def tokens_per_s(
    model: StepTimeModel,
    target_s: float,
    room: int,
    chat: StepBatch,
    doc_tokens: int,
    section_tokens: int,
    block_size: int = 16,
) -> float | None:
    """One document's prefill tokens over the step seconds it takes, each step sized to
    `target_s` beside `chat`; None when some position gets no chunk at this target."""
    seconds, done = 0.0, 0
    while done < doc_tokens:
        section, position = min(section_tokens, doc_tokens - done), 0
        while position < section:
            [granted] = size_batch_prefills(
                model, target_s, room, chat, [BatchPrefill(position, section - position)],
                block_size,
            )  # fmt: skip
            if granted == 0:
                return None
            chunk = PrefillChunk(granted, position)
            seconds += model.step_seconds(StepBatch((chunk,), chat.decode_seqs,
                                                    chat.decode_context_tokens))  # fmt: skip
            position += granted
        done += section
    return doc_tokens / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-config", type=Path, default=PROFILE)
    p.add_argument("--targets", default="40,47,50", help="Batch step targets, ms.")
    p.add_argument("--doc-tokens", type=int, default=80_000)
    p.add_argument("--section-tokens", type=int, default=2048)
    p.add_argument("--chat-decodes", type=int, default=45)
    p.add_argument("--chat-context", type=int, default=8000, help="Tokens per chat decode.")
    p.add_argument("--latency-model", type=Path, default=None,
                   help="Fit to price steps with (default: the config's latency_fit, else the "
                   "roofline of its hardware).")  # fmt: skip
    args = p.parse_args()

    from serving.engine_profile import load_profile, step_model
    from serving.replica_targets import configured_fit

    profile = load_profile(args.engine_config, [])
    model = step_model(profile, args.latency_model or configured_fit(args.engine_config, profile))
    room = int(profile.vllm.get("max-num-batched-tokens", 2048)) - args.chat_decodes
    chat = StepBatch((), args.chat_decodes, args.chat_decodes * args.chat_context)
    print(f"chat alone: {1000 * model.step_seconds(chat):.1f} ms a step; batch room {room} tokens")
    for ms in (float(t) for t in args.targets.split(",")):
        whole = tokens_per_s(model, ms / 1000, room, chat, args.doc_tokens, args.doc_tokens)
        cut = tokens_per_s(model, ms / 1000, room, chat, args.doc_tokens, args.section_tokens)
        ratio = f"{cut / whole:.2f}x" if whole and cut else "-"
        print(f"target {ms:g} ms: whole {whole or 0:,.0f} tok/s, {args.section_tokens}-token "
              f"sections {cut or 0:,.0f} tok/s, sections/whole {ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
