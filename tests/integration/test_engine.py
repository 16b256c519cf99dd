"""A real cpu-tiny replica: streaming through our client, metrics agreeing with what we streamed."""

from __future__ import annotations

import httpx
import pytest

from serving.client import StreamingClient
from serving.metrics import histogram_delta, parse_metrics

pytestmark = pytest.mark.engine

ITL = "vllm:inter_token_latency_seconds"


def scrape(url: str):
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


async def test_completion_and_chat_stream_with_timings(tiny_replica) -> None:
    url = tiny_replica.base_url
    before = scrape(url)
    async with StreamingClient(url, tiny_replica.served_model, run_id="it") as client:
        done = await client.complete(
            "The night shift begins",
            max_tokens=24,
            ignore_eos=True,
            cls="batch",
            stage="whole",
            doc_id="d1",
        )
        chat = await client.chat(
            [{"role": "user", "content": "Summarize the lease."}], max_tokens=12, ignore_eos=True
        )
    after = scrape(url)
    for result, n in ((done, 24), (chat, 12)):
        rec = result.record
        assert result.ok, rec.error
        # One arrival per streamed chunk; a lagging API server may merge steps into one chunk.
        assert rec.output_tokens == n and 1 <= len(result.token_times) <= n
        assert rec.prompt_tokens > 0
        assert 0 < rec.ttft_s < 30 and rec.e2e_s >= rec.ttft_s
        assert rec.itl_p50_s > 0 and rec.itl_p99_s >= rec.itl_p50_s
        assert len(rec.gaps) == len(result.token_times) - 1
    # The engine observes one gap per token after the first (a decode step makes one token).
    delta = histogram_delta(after.histogram(ITL), before.histogram(ITL))
    assert delta.count == (24 - 1) + (12 - 1)
    ttft = histogram_delta(
        after.histogram("vllm:time_to_first_token_seconds"),
        before.histogram("vllm:time_to_first_token_seconds"),
    )
    assert ttft.count == 2


async def test_priority_field_is_accepted(tiny_replica) -> None:
    async with StreamingClient(tiny_replica.base_url, tiny_replica.served_model) as client:
        low = await client.complete("x", max_tokens=2, priority=50)
    assert low.ok, low.record.error


async def test_stream_interval_sends_tokens_in_chunks(tiny_replica) -> None:
    async with StreamingClient(tiny_replica.base_url, tiny_replica.served_model) as client:
        done = await client.complete("x", max_tokens=17, ignore_eos=True, stream_interval=8)
    assert done.ok, done.record.error
    # The first token at once (TTFT), then chunks of 8: 1 + 8 + 8.
    assert done.record.output_tokens == 17 and len(done.token_times) == 3
    assert done.record.ttft_s is not None and done.record.gaps == []


def test_replica_has_its_own_group_in_the_callers_session(tiny_replica) -> None:
    """Stopping a replica signals one process group; sharing the caller's session keeps the engine
    in the caller's scheduling group (serving/launcher.py says what a session of its own cost)."""
    import os

    assert os.getpgid(tiny_replica.pid) == tiny_replica.pid
    assert os.getsid(tiny_replica.pid) == os.getsid(0)


def test_a_cpu_replica_runs_its_model_inside_the_engine_core(tiny_replica) -> None:
    """A one-process CPU world (`CPU_ENGINE_ENV` in serving/launcher.py): the engine core loads the
    model itself, so no worker process is started or logs beside it."""
    with open(tiny_replica.log, encoding="utf-8", errors="replace") as log:
        sources = {line.split(" pid=")[0].lstrip("(") for line in log if " pid=" in line[:40]}
    assert "EngineCore" in sources and "APIServer" in sources
    assert not {s for s in sources if "Worker" in s}, sources


async def test_a_batch_prompt_reuses_the_prefix_cache_only_under_its_own_salt(tiny_replica) -> None:
    """The benchmark sends the same documents in every scenario (`bench.scenarios.salted`): under
    another salt the engine prefills them again, under the same one it reads its cache."""
    from pipelines.summarize import cache_salt

    prompt = [(7 * i) % 500 + 10 for i in range(200)]
    async with StreamingClient(tiny_replica.base_url, tiny_replica.served_model) as client:

        async def cached(salt: str) -> int:
            done = await client.complete(prompt, max_tokens=1, extra=cache_salt(salt))
            assert done.ok, done.record.error
            return done.record.cached_tokens

        assert await cached("scenario-a") == 0
        assert await cached("scenario-a") >= 160, "same salt: the prompt's full blocks are cached"
        assert await cached("scenario-b") == 0, "another salt: prefilled again"
