"""`make demo`: start a cpu-small replica, stream one summary request through it, stop it.

Stopping happens on every exit path, Ctrl-C included, because the replica runs inside
`ReplicaSet.running`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from serving.client import StreamingClient
from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet

CONFIG = Path("engine_configs/cpu-small.yaml")
PORT = 8000


async def stream_one(url: str, model: str) -> None:
    text = Path("serving/model_text/nightshift_prose.txt").read_text()[:3000]
    async with StreamingClient(url, model, run_id="demo") as client:
        done = await client.chat(
            [{"role": "system", "content": "Summarize the document faithfully."},
             {"role": "user", "content": text}],
            max_tokens=64, ignore_eos=True, cls="batch", stage="whole")
    r = done.record
    print(f"summary ({r.output_tokens} tokens, random weights so the text is noise): "
          f"{done.text[:120]!r}")
    print(f"prompt {r.prompt_tokens} tokens, TTFT {r.ttft_s * 1000:.0f} ms, "
          f"ITL p50 {r.itl_p50_s * 1000:.1f} ms, p99 {r.itl_p99_s * 1000:.1f} ms, "
          f"E2E {r.e2e_s:.2f} s")


def main() -> int:
    config = load_engine_config(CONFIG)
    print(f"starting {config.name} on port {PORT} ...", flush=True)
    with ReplicaSet().running(config, str(CONFIG), PORT) as replicas:
        asyncio.run(stream_one(replicas[0].base_url, config.model.served_name))
    print("replica stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
