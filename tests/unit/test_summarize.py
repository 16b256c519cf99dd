"""A document's path through permits and requests, against in-process replicas (our own logic)."""

import itertools
import json
from dataclasses import dataclass

import httpx
import pytest

from pipelines.config import PipelineConfig
from pipelines.corpus import over_long_reason
from pipelines.errors import RunStopped
from pipelines.prompts import PromptKit
from pipelines.split import sections
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
    """Hands out permits whose `chunk_tokens` cycles through `chunk` (one value, or several to
    play a load that changes from one grant to the next)."""

    def __init__(
        self, replicas: list[str], chunk: int | list[int], stop_after: int | None = None
    ) -> None:
        self.up = list(replicas)
        self.chunks = itertools.cycle(chunk if isinstance(chunk, list) else [chunk])
        self.ids = itertools.count()
        self.released: list[dict] = []
        self.down: list[str] = []
        self.stop_after = stop_after
        self.prefills: list[tuple[str, int]] = []
        self.acquired: list[tuple[int, int]] = []

    async def acquire(self, doc_id, prompt_tokens, max_tokens, stage=None):
        n = next(self.ids)
        if self.stop_after is not None and n >= self.stop_after:
            raise RunStopped("run stopped: deadline")
        self.acquired.append((prompt_tokens, max_tokens))
        replica = self.up[n % len(self.up)]
        return Permit(f"p{n}", replica, f"http://{replica}", next(self.chunks))

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
        self.max_tokens: list[int] = []
        self.dead = dead

    def client(self, base_url, replica):
        def handler(request: httpx.Request) -> httpx.Response:
            if replica in self.dead:
                raise httpx.ConnectError("refused")
            body = json.loads(request.content)
            self.prompts.append((replica, body["prompt"]))
            self.max_tokens.append(body["max_tokens"])
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
    max_model_len=2000,
    section_tokens=300,
    section_summary_tokens=4,
    final_summary_tokens=6,
    overlap_tokens=10,
)
KIT = PromptKit.build(WordTokenizer())
LONG = 3000  # tokens: too long to go whole in CFG's context


def job(gate, pool, cfg=CFG) -> DocumentJob:
    tok = WordTokenizer()
    return DocumentJob(gate, pool, tok, PromptKit.build(tok), cfg)


def whole_fit(cfg: PipelineConfig) -> int:
    """The longest document whose whole prompt plus summary exactly fills the context."""
    return cfg.max_model_len - KIT.whole_overhead - cfg.final_summary_tokens


async def test_short_document_goes_whole() -> None:
    gate, pool = FakeGate(["a"], chunk=2000), Pool()
    out = await job(gate, pool).summarize("d", list(range(100)))
    assert out.status == "done" and out.sections == 1
    assert [r.stage for r in out.records] == ["whole"]
    assert out.summary == "ssssss"  # final_summary_tokens
    assert gate.prefills == [("p0", len(pool.prompts[0][1]))]  # the Gate hears of the prefill


async def test_long_document_maps_fixed_sections_then_reduces() -> None:
    gate, pool = FakeGate(["a"], chunk=400), Pool()
    doc = list(range(LONG))
    out = await job(gate, pool).summarize("d", doc)
    spans = sections(LONG, 300, 10)
    assert out.status == "done" and out.sections == len(spans) == 11
    stages = [r.stage for r in out.records]
    assert stages == ["map"] * len(spans) + ["reduce"]
    prompts = [p for _, p in pool.prompts]
    assert prompts[: len(spans)] == [KIT.section(doc[s:e]) for s, e in spans]
    assert pool.max_tokens == [4] * len(spans) + [6]  # section summaries, then the final one
    assert gate.acquired == [(len(p), m) for p, m in zip(prompts, pool.max_tokens, strict=True)]
    assert out.summary == "ssssss"
    assert out.batch_tokens == sum(r.prompt_tokens + r.output_tokens for r in out.records)


@pytest.mark.parametrize("chunk", [1, 16, [16, 5000, 2, 300], 1_000_000])
async def test_permit_caps_never_change_the_sections(chunk) -> None:
    """The Gate's `chunk_tokens` (here tiny, huge, or changing at every grant) sizes nothing."""
    reference = Pool()
    await job(FakeGate(["a"], chunk=300), reference).summarize("d", list(range(LONG)))
    pool = Pool()
    out = await job(FakeGate(["a"], chunk=chunk), pool).summarize("d", list(range(LONG)))
    assert out.status == "done" and pool.prompts == reference.prompts
    maps = pool.prompts[: out.sections]
    assert all(len(p) - KIT.section_overhead == 300 for _, p in maps[:-1])  # exactly section_tokens


async def test_a_document_that_exactly_fills_the_context_goes_whole() -> None:
    n = whole_fit(CFG)
    gate, pool = FakeGate(["a"], chunk=16), Pool()
    out = await job(gate, pool).summarize("d", list(range(n)))
    assert [r.stage for r in out.records] == ["whole"] and out.sections == 1
    ((_, prompt),) = pool.prompts
    assert len(prompt) + CFG.final_summary_tokens == CFG.max_model_len


async def test_one_token_over_the_context_goes_map_reduce_under_auto() -> None:
    n = whole_fit(CFG) + 1
    gate, pool = FakeGate(["a"], chunk=1_000_000), Pool()
    out = await job(gate, pool).summarize("d", list(range(n)))
    assert out.status == "done"
    assert [r.stage for r in out.records] == ["map"] * len(sections(n, 300, 10)) + ["reduce"]


async def test_one_token_over_the_context_fails_under_whole_naming_the_fix() -> None:
    cfg = CFG.model_copy(update={"mode": "whole"})
    gate, pool = FakeGate(["a"], chunk=1_000_000), Pool()
    fits = await job(gate, pool, cfg).summarize("fits", list(range(whole_fit(cfg))))
    assert fits.status == "done" and [r.stage for r in fits.records] == ["whole"]
    out = await job(gate, pool, cfg).summarize("d", list(range(whole_fit(cfg) + 1)))
    assert out.status == "failed" and out.records == []
    assert "too long to send whole" in out.reason and "max_model_len 2000" in out.reason
    assert "set mode to auto or map_reduce" in out.reason
    assert len(pool.prompts) == 1  # nothing was sent for the failed document


async def test_a_document_over_max_doc_tokens_is_failed_with_the_reason() -> None:
    cfg = CFG.model_copy(update={"max_doc_tokens": 2500})
    gate, pool = FakeGate(["a"], chunk=2000), Pool()
    out = await job(gate, pool, cfg).summarize("d", list(range(2501)))
    assert out.status == "failed" and out.reason == over_long_reason(2501, 2500)
    assert "raise max_doc_tokens" in out.reason and out.records == [] and pool.prompts == []
    at_limit = await job(gate, pool, cfg).summarize("e", list(range(2500)))
    assert at_limit.status == "done"


async def test_every_reduce_prompt_and_its_output_fit_the_context() -> None:
    # large section summaries in a small context: the reduce needs several rounds
    cfg = CFG.model_copy(
        update={"max_model_len": 1000, "section_summary_tokens": 100, "final_summary_tokens": 150}
    )
    gate, pool = FakeGate(["a"], chunk=50), Pool()
    out = await job(gate, pool, cfg).summarize("d", list(range(5000)))
    assert out.status == "done"
    stages = [r.stage for r in out.records]
    assert stages.count("reduce") >= 3 and stages[-1] == "reduce"
    for (_, prompt), max_tokens in zip(pool.prompts, pool.max_tokens, strict=True):
        assert len(prompt) + max_tokens <= cfg.max_model_len
    assert pool.max_tokens[-1] == 150 and out.summary == "s" * 150


async def test_sections_shrink_only_to_fit_a_context_too_short_for_section_tokens() -> None:
    cfg = CFG.model_copy(update={"max_model_len": 1000, "section_tokens": 8192})
    room = 1000 - KIT.section_overhead - cfg.section_summary_tokens
    gate, pool = FakeGate(["a"], chunk=[7, 90_000]), Pool()
    out = await job(gate, pool, cfg).summarize("d", list(range(5000)))
    assert out.status == "done" and out.sections == len(sections(5000, room, 10))
    maps = [p for _, p in pool.prompts[: out.sections]]
    assert all(len(p) + cfg.section_summary_tokens == 1000 for p in maps[:-1])


async def test_prompts_of_different_documents_share_the_instruction_prefix() -> None:
    gate, pool = FakeGate(["a"], chunk=300), Pool()
    await job(gate, pool).summarize("short", list(range(500, 600)))
    await job(gate, pool).summarize("long", list(range(1000, 1000 + LONG)))
    head = list(KIT.instruction)
    assert len(pool.prompts) > 3
    assert all(p[: len(head)] == head for _, p in pool.prompts)


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
    out = await job(gate, pool).summarize("d", list(range(LONG)))
    assert out.status == "stopped" and len(out.records) == 2


async def test_map_reduce_mode_never_sends_whole() -> None:
    gate, pool = FakeGate(["a"], chunk=5000), Pool()
    cfg = CFG.model_copy(update={"mode": "map_reduce"})
    out = await job(gate, pool, cfg).summarize("d", list(range(100)))
    assert [r.stage for r in out.records] == ["map"]
    out = await job(gate, pool, cfg).summarize("e", list(range(700)))  # fits whole, still mapped
    assert [r.stage for r in out.records] == ["map", "map", "map", "reduce"]


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
