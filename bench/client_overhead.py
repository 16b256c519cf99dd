"""The client side must never be what limits a GPU replica: client CPU per request and the Gate's
permit rate, measured against a trivial local HTTP responder (no engine, so only our cost shows).

    .venv/bin/python -m bench.client_overhead [--requests 400] [--tokens 64] [--permits 2000]

Targets (issue 5): under 5 ms of client CPU per streamed request, at least 200 permits/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pipelines.gate import GateActor
from serving.client import StreamingClient


def sse_body(tokens: int) -> bytes:
    chunks = [
        json.dumps({"choices": [{"index": 0, "text": " tok", "token_ids": [7]}]})
        for _ in range(tokens)
    ]
    chunks.append(
        json.dumps({"choices": [], "usage": {"prompt_tokens": 512, "completion_tokens": tokens}})
    )
    return "".join(f"data: {c}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


async def responder(tokens: int) -> tuple[asyncio.AbstractServer, int]:
    """An HTTP/1.1 server on loopback that answers every POST with a streamed completion."""
    body = sse_body(tokens)
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in headers.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def client_cpu_per_request(requests: int, tokens: int, concurrency: int) -> dict:
    server, port = await responder(tokens)
    async with server, StreamingClient(f"http://127.0.0.1:{port}", "m") as client:
        await client.complete([1] * 512, max_tokens=tokens)  # connection set-up, imports
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                done = await client.complete([1] * 512, max_tokens=tokens, cls="batch", stage="map")
                assert done.ok and len(done.token_times) == tokens

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    # The responder runs in this process too, so this over-counts the client's share.
    return {
        "requests": requests,
        "tokens_per_request": tokens,
        "cpu_ms_per_request": cpu / requests * 1000,
        "requests_per_s": requests / wall,
    }


async def gate_permits_per_s(permits: int) -> dict:
    gate = GateActor(
        "bench",
        [(f"r{i}", f"http://127.0.0.1:{9 + i}") for i in range(4)],
        policy="static",
        static_caps=(64, 2048),
        sensor={"kind": "streamed"},
    )
    await gate.poll_now()
    t0 = time.perf_counter()
    for i in range(permits):
        p = await gate.acquire(f"d{i}", 2000, 64)
        await gate.release(p.permit_id, None)
    seconds = time.perf_counter() - t0
    await gate.close()
    return {
        "permits": permits,
        "permits_per_s": permits / seconds,
        "us_per_acquire_release": seconds / permits * 1e6,
    }


async def ray_gate_permits_per_s(permits: int, concurrency: int) -> dict:
    """The same through the Ray actor, as workers reach it: one round trip per acquire/release."""
    import ray

    from pipelines.gate import start_gate

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        gate = start_gate(
            "bench-ray",
            [("r0", "http://127.0.0.1:9")],
            policy="static",
            static_caps=(concurrency, 2048),
            sensor={"kind": "streamed"},
        )
        await gate.poll_now.remote()

        async def worker(n: int) -> None:
            for i in range(n):
                p = await gate.acquire.remote(f"d{i}", 2000, 64)
                await gate.release.remote(p.permit_id, None)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(permits // concurrency) for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    finally:
        ray.shutdown()
    done = permits // concurrency * concurrency
    return {"permits": done, "concurrency": concurrency, "permits_per_s": done / seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--permits", type=int, default=2000)
    args = p.parse_args()
    client = asyncio.run(client_cpu_per_request(args.requests, args.tokens, args.concurrency))
    gate = asyncio.run(gate_permits_per_s(args.permits))
    via_ray = asyncio.run(ray_gate_permits_per_s(args.permits // 2, args.concurrency))
    print(json.dumps({"client": client, "gate": gate, "gate_via_ray": via_ray}, indent=2))
    print(
        f"client CPU per request: {client['cpu_ms_per_request']:.2f} ms (target < 5 ms); "
        f"gate: {gate['permits_per_s']:,.0f} permits/s in process, "
        f"{via_ray['permits_per_s']:,.0f} through the Ray actor (target >= 200)"
    )


if __name__ == "__main__":
    main()
