"""The client's own logic (SSE parsing, timing, retries) against an in-process transport."""

import json

import httpx
import pytest

from serving.client import ClientConfig, StreamingClient

FAST_RETRY = ClientConfig(retries=2, backoff_s=0.001, backoff_max_s=0.002)


def sse(chunks: list[dict]) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def completion_stream(texts: list[str], prompt_tokens: int = 7, cached: int = 3) -> bytes:
    chunks = [{"choices": [{"index": 0, "text": t, "token_ids": [i]}]} for i, t in enumerate(texts)]
    chunks.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(texts),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )
    return sse(chunks)


def client_for(handler, config: ClientConfig = FAST_RETRY) -> StreamingClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return StreamingClient(
        "http://replica:8000", "m", run_id="r1", replica="rep-a", config=config, http=http
    )


async def test_stream_yields_text_record_and_gaps() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, content=completion_stream(["a", "b", "", "c"]))

    done = await client_for(handler).complete(
        "hi", max_tokens=4, cls="batch", stage="map", doc_id="d1"
    )
    rec = done.record
    assert done.text == "abc" and done.ok
    assert seen["priority"] == 10 and seen["stream"] is True and seen["max_tokens"] == 4
    assert seen["stream_options"] == {"include_usage": True}
    # The empty-text chunk carried a token id (partial UTF-8): it still counts as an arrival.
    assert len(done.token_times) == 4 and len(rec.gaps) == 3
    assert rec.prompt_tokens == 7 and rec.cached_tokens == 3 and rec.output_tokens == 4
    assert rec.ttft_s is not None and rec.ttft_s >= 0
    assert rec.e2e_s >= rec.ttft_s
    assert rec.itl_max_s >= rec.itl_p99_s >= rec.itl_p50_s >= 0
    assert [g.idx for g in rec.gaps] == [0, 1, 2]
    assert rec.row()["class"] == "batch" and rec.row()["doc_id"] == "d1"


async def test_stream_interval_asks_for_chunks_and_records_no_gaps() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        chunks = [
            {"choices": [{"index": 0, "text": "a", "token_ids": [1]}]},
            {"choices": [{"index": 0, "text": "bcd", "token_ids": [2, 3, 4]}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
        ]
        return httpx.Response(200, content=sse(chunks))

    done = await client_for(handler).complete("hi", max_tokens=4, cls="batch", stream_interval=3)
    rec = done.record
    assert seen["stream_interval"] == 3
    assert done.text == "abcd" and rec.output_tokens == 4 and rec.ttft_s is not None
    # A chunk's arrival spans three engine steps: no gap may pass for one.
    assert rec.gaps == [] and rec.itl_p99_s is None


async def test_every_token_streams_by_default() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, content=completion_stream(["a", "b"]))

    await client_for(handler).complete("hi", max_tokens=2)
    assert "stream_interval" not in seen


async def test_chat_uses_chat_priority_and_delta_content() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/v1/chat/completions" and body["priority"] == 0
        chunks = [
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": "hel"}}]},
            {"choices": [{"delta": {"content": "lo"}}]},
        ]
        return httpx.Response(200, content=sse(chunks))

    done = await client_for(handler).chat([{"role": "user", "content": "x"}], max_tokens=2)
    assert done.text == "hello" and len(done.token_times) == 2


async def test_retries_503_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(503)
        return httpx.Response(200, content=completion_stream(["x"]))

    done = await client_for(handler).complete("hi", max_tokens=1)
    assert done.ok and len(calls) == 3


async def test_connection_refused_gives_up_with_reason() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    done = await client_for(handler).complete("hi", max_tokens=1)
    assert done.record.status == "error"
    assert "ConnectError" in done.record.error and "3 attempts" in done.record.error
    assert done.replica_failed


async def test_client_error_is_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"error": "prompt too long"})

    done = await client_for(handler).complete("hi", max_tokens=1)
    assert done.record.status == "error" and "400" in done.record.error and len(calls) == 1
    assert not done.replica_failed


class BreaksAfterTokens(httpx.AsyncByteStream):
    async def __aiter__(self):
        yield sse([{"choices": [{"text": "a", "token_ids": [1]}]}])[: -len("data: [DONE]\n\n")]
        raise httpx.ReadError("connection reset")


async def test_stream_broken_after_tokens_is_never_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, stream=BreaksAfterTokens())

    done = await client_for(handler).complete("hi", max_tokens=5)
    assert len(calls) == 1
    assert done.record.status == "error" and "after 1 tokens" in done.record.error
    assert done.replica_failed
    assert done.text == "a"


async def test_total_timeout_marks_request() -> None:
    import asyncio

    class Slow(httpx.AsyncByteStream):
        async def __aiter__(self):
            await asyncio.sleep(5)
            yield b""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Slow())

    client = client_for(handler, ClientConfig(total_timeout_s=0.05))
    done = await client.complete("hi", max_tokens=1)
    assert done.record.status == "timeout"


@pytest.mark.parametrize("bad", [{"error": {"message": "boom"}}])
async def test_error_event_mid_stream_before_tokens_is_retryable(bad) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, content=sse([bad]))

    done = await client_for(handler).complete("hi", max_tokens=1)
    assert len(calls) == 3 and done.record.status == "error"
