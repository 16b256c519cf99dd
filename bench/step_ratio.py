"""How much a prefill chunk costs against a decode step, early and deep into a long prompt.

A faithful small-scale stand-in for a GPU replica has a 512-token chunk at a short prefix cost about
one to two decode steps, and several times more deep into a long document (attention grows with the
prefix). This measures it on a running replica, in up to three phases:

1. The chat streams decode alone; the median gap of the first is the decode step.
2. With `--alone`, one long prompt is prefilled with nothing else running; its time to first token
   is the whole prefill.
3. The chat streams decode while a short prompt (`--window` tokens) and then a long one
   (`--prompt-tokens`) are prefilled in chunks. Each gap the first chat stream sees during a prefill
   is one step carrying one chunk of `--step-tokens` less one token per chat stream, at a prefix
   position that grows by the chunk size per step. A prompt's steps are counted back from its first
   token, because its head is not a step: while the API server takes in a long prompt the engine
   runs decode-only steps whose tokens reach the client in one burst. The shallow chunk is the
   median step of the short prompt; the deep chunk the median step of the long one with its prefix
   within `--window` below `--deep-prefix` (default: the prompt's end).

It prints (a) shallow chunk / decode step, (b) deep chunk / shallow chunk and (c) the prefill alone.
With `--predict ENGINE_CONFIG` it prints beside them what the planner's roofline predicts for that
replica's model at the same shape: chat streams and their context, a step of `--step-tokens`, the
same prefix positions and prompt. Prompts are random token ids below 1024 (every local model's
vocabulary holds them), so lengths are exact, and drawn from a fresh `--seed` each run, so no long
prompt shares a prefix with another or finds one cached.

    .venv/bin/python -m bench.step_ratio --url http://127.0.0.1:8000 --model nightshift-small
    .venv/bin/python -m bench.step_ratio --model nightshift-long --prompt-tokens 81920 \
        --deep-prefix 79872 --alone --chat-tokens 600 \
        --predict engine_configs/h100x2-llama-3.1-70b-fp8.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from dataclasses import dataclass

from serving.client import ClientConfig, StreamingClient

FIRST_ID, ID_LIMIT = 16, 1024
"""Prompt ids are drawn from [FIRST_ID, ID_LIMIT): past the special tokens, inside every local
model's vocabulary."""


def long_prompt(tokens: int, seed: int) -> list[int]:
    """`tokens` random token ids that share no prefix with other seeds' prompts."""
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, ID_LIMIT) for _ in range(tokens)]


@dataclass
class Figures:
    """The step times the three ratios come from, in seconds; `alone_s` is None where the
    prefill-alone phase did not run."""

    decode_s: float
    shallow_s: float
    deep_s: float
    deep_prefix: int
    alone_s: float | None

    def lines(self, label: str) -> list[str]:
        out = [
            f"{label}: decode step {self.decode_s * 1000:.1f} ms, shallow chunk "
            f"{self.shallow_s * 1000:.1f} ms, deep chunk (prefix ~{self.deep_prefix:,}) "
            f"{self.deep_s * 1000:.1f} ms",
            f"  (a) shallow chunk / decode step: {self.shallow_s / self.decode_s:.2f}",
            f"  (b) deep chunk / shallow chunk:  {self.deep_s / self.shallow_s:.2f}",
        ]
        if self.alone_s is not None:
            out.append(f"  (c) prefill alone:               {self.alone_s:.1f} s")
        return out


def chunk_prefixes(prompt_tokens: int, chunk: int) -> list[int]:
    """Prefix position of each chunk of a prompt prefilled `chunk` tokens per step."""
    return list(range(0, prompt_tokens, chunk))


def deep_steps(prefixes: list[int], window: int, deep_prefix: int | None) -> list[int]:
    """Indices of the steps whose prefix lies within `window` below `deep_prefix` (or the end)."""
    end = prefixes[-1] if deep_prefix is None else min(deep_prefix, prefixes[-1])
    return [i for i, p in enumerate(prefixes) if end - window < p <= end]


def prefill_gaps(chat, batch, steps: int) -> list[float] | None:
    """The chat stream's last `steps` gaps before `batch`'s first token: its prefill's steps."""
    t1 = batch.record.t_first_token
    during = [g.gap_s for g in chat.record.gaps if batch.record.t_submit < g.t <= (t1 or 0)]
    return during[-steps:] if t1 is not None and len(during) >= steps else None


def predict(args: argparse.Namespace) -> Figures:
    """The planner's roofline figures for `args.predict`'s model at the bench's shape."""
    from scheduler.step import PrefillChunk, StepBatch
    from serving.engine_config import load_engine_config
    from serving.engine_profile import ProfileError, step_model

    try:
        model = step_model(load_engine_config(args.predict), None)
    except ProfileError as exc:
        raise SystemExit(f"--predict: {exc}") from None
    streams, context = args.chat_streams, args.chat_streams * args.chat_context
    chunk = args.step_tokens - streams
    prefixes = chunk_prefixes(args.prompt_tokens, chunk)
    deep = deep_steps(prefixes, args.window, args.deep_prefix)

    def step(prefix: int) -> float:
        return model.step_seconds(StepBatch((PrefillChunk(chunk, prefix),), streams, context))

    alone = sum(
        model.step_seconds(
            StepBatch((PrefillChunk(min(args.step_tokens, args.prompt_tokens - p), p),))
        )
        for p in range(0, args.prompt_tokens, args.step_tokens)
    )
    return Figures(
        decode_s=model.step_seconds(StepBatch((), streams, context)),
        shallow_s=statistics.median(step(p) for p in chunk_prefixes(args.window, chunk)),
        deep_s=statistics.median(step(prefixes[i]) for i in deep),
        deep_prefix=int(statistics.median(prefixes[i] for i in deep)),
        alone_s=alone if args.alone else None,
    )


async def main_async(args: argparse.Namespace) -> Figures | None:
    # a long prefill sends nothing until its first token: wait for it as long as the whole request
    config = ClientConfig(read_timeout_s=1800.0)
    async with StreamingClient(args.url, args.model, config=config) as client:
        alone = await asyncio.gather(
            *(
                client.complete(
                    long_prompt(args.chat_context, args.seed + i), max_tokens=150, ignore_eos=True
                )
                for i in range(args.chat_streams)
            )
        )
        decode_step = statistics.median(g.gap_s for g in alone[0].record.gaps)
        alone_s = None
        if args.alone:
            solo = await client.complete(
                long_prompt(args.prompt_tokens, args.seed + 2000),
                max_tokens=1,
                cls="batch",
                stage="whole",
            )
            if not solo.ok:
                raise SystemExit(f"prefill alone failed: {solo.record.error}")
            alone_s = solo.record.t_first_token - solo.record.t_submit
        chats = [
            asyncio.create_task(
                client.complete(
                    long_prompt(args.chat_context, args.seed + i),
                    max_tokens=args.chat_tokens,
                    ignore_eos=True,
                )
            )
            for i in range(args.chat_streams)
        ]
        await asyncio.sleep(1.0)
        short = await client.complete(
            long_prompt(args.window, args.seed + 1001), max_tokens=1, cls="batch", stage="whole"
        )
        batch = await client.complete(
            long_prompt(args.prompt_tokens, args.seed + 1000),
            max_tokens=1,
            cls="batch",
            stage="whole",
        )
        chat = (await asyncio.gather(*chats))[0]
    chunk = args.step_tokens - args.chat_streams
    prefixes = chunk_prefixes(args.prompt_tokens, chunk)
    shallow = prefill_gaps(chat, short, len(chunk_prefixes(args.window, chunk)))
    steps = prefill_gaps(chat, batch, len(prefixes))
    print(
        f"decode step, {args.chat_streams} chat streams of {args.chat_context} tokens "
        f"(median gap): {decode_step * 1000:.1f} ms"
    )
    if alone_s is not None:
        print(f"prefill alone: {args.prompt_tokens} tokens to the first token in {alone_s:.1f} s")
    if shallow is None or steps is None or chat.record.t_end <= batch.record.t_first_token:
        print("fewer gaps than prefill steps, or chat ended first; raise --chat-tokens")
        return None
    print(
        f"batch prompt: {args.prompt_tokens} tokens in {len(prefixes)} chunks of {chunk} beside "
        f"chat, {batch.record.t_first_token - batch.record.t_submit:.2f} s to the first token"
    )
    deep = deep_steps(prefixes, args.window, args.deep_prefix)
    return Figures(
        decode_s=decode_step,
        shallow_s=statistics.median(shallow),
        deep_s=statistics.median(steps[i] for i in deep),
        deep_prefix=int(statistics.median(prefixes[i] for i in deep)),
        alone_s=alone_s,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="nightshift-small")
    p.add_argument("--prompt-tokens", type=int, default=24_000)
    p.add_argument("--chat-tokens", type=int, default=3000)
    p.add_argument("--chat-streams", type=int, default=4)
    p.add_argument("--chat-context", type=int, default=1000)
    p.add_argument("--window", type=int, default=4096, help="Prefix span of each window, tokens.")
    p.add_argument(
        "--deep-prefix", type=int, default=None, help="End of the deep window (default: the end)."
    )
    p.add_argument("--alone", action="store_true", help="Also time a prefill with nothing beside.")
    p.add_argument("--predict", default=None, help="Engine config whose roofline to print beside.")
    p.add_argument(
        "--step-tokens", type=int, default=512, help="The replica's max-num-batched-tokens."
    )
    p.add_argument(
        "--seed", type=int, default=None, help="Prompt seed (default: fresh, so none is cached)."
    )
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1, 2**20) * 10_000
    measured = asyncio.run(main_async(args))
    if measured is not None:
        print("\n".join(measured.lines(f"measured ({args.model})")))
    if args.predict:
        print("\n".join(predict(args).lines(f"predicted ({args.predict})")))


if __name__ == "__main__":
    main()
