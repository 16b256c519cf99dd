"""How much a prefill chunk costs against a decode step, early and deep into a long prompt.

A faithful small-scale stand-in for a GPU replica has a 512-token chunk at a short prefix cost about
one to two decode steps, and several times more deep into a long document (attention grows with the
prefix). This measures it on a running replica: one chat stream decodes alone (the decode step), then
decodes while a long prompt is prefilled in chunks; each gap the chat stream sees during the prefill
is one step carrying one chunk, at a prefix position that grows by the chunk size per step.

    .venv/bin/python -m bench.step_ratio --url http://127.0.0.1:8000 --model nightshift-small
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from serving.client import StreamingClient

WORDS = (
    "river market ledger contract night shift summary tenant clause engine token step "
    "memory bakery harbor station freight archive report window latency"
).split()


def long_prompt(tokens_approx: int, seed: int) -> str:
    """Text of roughly `tokens_approx` tokens that shares no prefix with other prompts."""
    rng = __import__("random").Random(seed)
    return f"[{seed}] " + " ".join(rng.choice(WORDS) for _ in range(tokens_approx))


async def main_async(args: argparse.Namespace) -> None:
    async with StreamingClient(args.url, args.model) as client:
        alone = await asyncio.gather(
            *(
                client.complete(long_prompt(args.chat_context, i), max_tokens=150, ignore_eos=True)
                for i in range(args.chat_streams)
            )
        )
        decode_step = statistics.median(g.gap_s for g in alone[0].record.gaps)
        chats = [
            asyncio.create_task(
                client.complete(
                    long_prompt(args.chat_context, i), max_tokens=args.chat_tokens, ignore_eos=True
                )
            )
            for i in range(args.chat_streams)
        ]
        await asyncio.sleep(1.0)
        batch = await client.complete(
            long_prompt(args.prompt_tokens, 1000), max_tokens=1, cls="batch", stage="whole"
        )
        chat = (await asyncio.gather(*chats))[0]
    t0, t1 = batch.record.t_submit, batch.record.t_first_token or batch.record.t_end
    during = [g.gap_s for g in chat.record.gaps if t0 < g.t <= t1]
    n = len(during)
    print(
        f"decode step, {args.chat_streams} chat streams of ~{args.chat_context} tokens "
        f"(median gap): {decode_step * 1000:.1f} ms"
    )
    print(
        f"batch prompt: {batch.record.prompt_tokens} tokens prefilled in {n} steps "
        f"({(t1 - t0):.2f} s)"
    )
    if n < 4:
        print("too few steps observed; lengthen --chat-tokens")
        return
    for label, part in (("first quarter", during[: n // 4]), ("last quarter", during[-n // 4 :])):
        med = statistics.median(part)
        print(
            f"{label:>13} of the prefill: step {med * 1000:.1f} ms = {med / decode_step:.1f} "
            "decode steps"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="nightshift-small")
    p.add_argument("--prompt-tokens", type=int, default=24_000)
    p.add_argument("--chat-tokens", type=int, default=3000)
    p.add_argument("--chat-streams", type=int, default=4)
    p.add_argument("--chat-context", type=int, default=1000)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
