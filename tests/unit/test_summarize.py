"""A document's path through permits and requests, against in-process replicas (our own logic)."""

import itertools
import json
from dataclasses import dataclass

import httpx

from pipelines.config import PipelineConfig
from pipelines.errors import RunStopped
from pipelines.prompts import PromptKit
from pipelines.summarize import DocumentJob
from serving.client import ClientConfig, StreamingClient


class WordTokenizer:
    """One token per character: enough to check sizes exactly."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


@dataclass(frozen=True)
class Permit:
    permit_id: str
    replica: str
    base_url: str
    chunk_tokens: int
    priority: int = 10


class FakeGate:
    def __init__(self, replicas: list[str], chunk: int, stop_after: int | None = None) -> None:
        self.up = list(replicas)
        self.chunk = chunk
        self.ids = itertools.count()
        self.released: list[dict] = []
        self.down: list[str] = []
        self.stop_after = stop_after
        self.prefills: list[tuple[str, int]] = []

    async def acquire(self, doc_id, prompt_tokens, max_tokens):
        n = next(self.ids)
        if self.stop_after is not None and n >= self.stop_after:
            raise RunStopped("run stopped: deadline")
        replica = self.up[n % len(self.up)]
        return Permit(f"p{n}", replica, f"http://{replica}", self.chunk)

    async def release(self, permit_id, row, gaps):
        self.released.append(row)

    async def mark_down(self, replica):
        self.down.append(replica)
        self.up.remove(replica)

    async def prefilled(self, permit_id, tokens):
        self.prefills.append((permit_id, tokens))


def stream(n_tokens: int) -> bytes:
    chunks = [{"choices": [{"text": "s", "token_ids": [1]}]} for _ in range(n_tokens)]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n_tokens}})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


class Pool:
    def __init__(self, dead: set[str] = frozenset()) -> None:
        self.prompts: list[tuple[str, list[int]]] = []
        self.dead = dead

    def client(self, base_url, replica):
        def handler(request: httpx.Request) -> httpx.Response:
            if replica in self.dead:
                raise httpx.ConnectError("refused")
            body = json.loads(request.content)
            self.prompts.append((replica, body["prompt"]))
            return httpx.Response(200, content=stream(body["max_tokens"]))

        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        return StreamingClient(
            base_url,
            "m",
            replica=replica,
            http=http,
            config=ClientConfig(retries=0, backoff_s=0.001),
        )


CFG = PipelineConfig(
    max_model_len=100_000,
    section_summary_tokens=4,
    final_summary_tokens=6,
    overlap_tokens=10,
    min_section_tokens=50,
)


def job(gate, pool, cfg=CFG) -> DocumentJob:
    tok = WordTokenizer()
    return DocumentJob(gate, pool, tok, PromptKit.build(tok), cfg)


async def test_short_document_goes_whole() -> None:
    gate, pool = FakeGate(["a"], chunk=2000), Pool()
    out = await job(gate, pool).summarize("d", list(range(100)))
    assert out.status == "done" and out.sections == 1
    assert [r.stage for r in out.records] == ["whole"]
    assert out.summary == "ssssss"  # final_summary_tokens
    assert gate.prefills == [("p0", len(pool.prompts[0][1]))]  # the Gate hears of the prefill


async def test_long_document_maps_sections_under_the_cap_then_reduces() -> None:
    gate, pool = FakeGate(["a"], chunk=400), Pool()
    kit = PromptKit.build(WordTokenizer())
    out = await job(gate, pool).summarize("d", list(range(1000)))
    stages = [r.stage for r in out.records]
    assert stages.count("map") == out.sections >= 3 and stages[-1] == "reduce"
    for _, prompt in pool.prompts:
        assert len(prompt) <= 400 or prompt[: len(kit.instruction)] == list(kit.instruction)
    maps = [p for (_, p), st in zip(pool.prompts, stages, strict=True) if st == "map"]
    uncached = [len(p) - len(kit.instruction) for p in maps]
    assert all(n <= 400 for n in uncached)  # the cap counts what the replica must prefill
    assert all(p[: len(kit.instruction)] == list(kit.instruction) for _, p in pool.prompts)
    assert out.batch_tokens == sum(r.prompt_tokens + r.output_tokens for r in out.records)


async def test_dead_replica_is_marked_down_and_the_request_moves() -> None:
    gate, pool = FakeGate(["a", "b"], chunk=2000), Pool(dead={"a"})
    out = await job(gate, pool).summarize("d", list(range(50)))
    assert out.status == "done" and gate.down == ["a"]
    assert [r.replica for r in out.records] == ["a", "b"]
    assert out.records[0].status == "error" and out.replicas == ["b"]


async def test_all_replicas_dead_fails_the_document_with_reason() -> None:
    gate, pool = FakeGate(["a", "b", "c", "d"], chunk=2000), Pool(dead={"a", "b", "c", "d"})
    out = await job(gate, pool).summarize("d", list(range(50)))
    assert out.status == "failed" and "gave up after 3 replicas" in out.reason


async def test_stopped_run_leaves_the_document_unfinished_not_failed() -> None:
    gate, pool = FakeGate(["a"], chunk=300, stop_after=2), Pool()
    out = await job(gate, pool).summarize("d", list(range(2000)))
    assert out.status == "stopped" and len(out.records) == 2


async def test_map_reduce_mode_never_sends_whole() -> None:
    gate, pool = FakeGate(["a"], chunk=5000), Pool()
    cfg = CFG.model_copy(update={"mode": "map_reduce"})
    out = await job(gate, pool, cfg).summarize("d", list(range(100)))
    assert [r.stage for r in out.records] == ["map"]


async def test_abort_cancels_the_request_in_flight_and_frees_its_seat() -> None:
    import asyncio

    class Slow(httpx.AsyncByteStream):
        async def __aiter__(self):
            await asyncio.sleep(30)
            yield b""

    class SlowPool:
        def client(self, base_url, replica):
            http = httpx.AsyncClient(
                transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=Slow()))
            )
            return StreamingClient(base_url, "m", replica=replica, http=http)

    gate = FakeGate(["a"], chunk=2000)
    doc = job(gate, SlowPool())
    asyncio.get_running_loop().call_later(0.05, doc.abort.set)
    out = await asyncio.wait_for(doc.summarize("d", list(range(50))), timeout=5)
    assert out.status == "stopped" and "aborted" in out.reason
    assert gate.released == [None]  # the seat came back without a record


async def test_a_cap_below_the_minimum_section_still_makes_progress() -> None:
    gate, pool = FakeGate(["a"], chunk=16), Pool()
    cfg = CFG.model_copy(update={"min_section_tokens": 200})
    out = await job(gate, pool, cfg).summarize("d", list(range(1000)))
    assert out.status == "done" and out.sections <= 1000 // (200 - 10) + 1
