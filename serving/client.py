"""Async streaming client for vLLM's OpenAI-compatible API, timing every token.

Every request becomes a `RequestRecord` with per-token arrival times, so TTFT and ITL come from what
the caller actually saw, not from server-side averages. Retries cover the cases where nothing has been
generated yet (connection refused, 429, 503); a request that already streamed tokens is never retried,
because the engine did that work and a retry would count it twice.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx

from scheduler.records import RequestClass, RequestRecord, Stage

RETRY_STATUS = frozenset({429, 503})
CHAT_PRIORITY = 0  # vLLM runs lower priority values first
BATCH_PRIORITY = 10


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts and retry policy for one replica."""

    connect_timeout_s: float = 5.0
    """Time to open a connection before the attempt counts as failed (and may be retried)."""
    read_timeout_s: float = 60.0
    """Longest silence between two streamed chunks; a long prefill happens before the first one."""
    total_timeout_s: float = 1800.0
    """Hard limit for one request, all attempts included."""
    retries: int = 3
    """Extra attempts after a retryable failure that streamed nothing."""
    backoff_s: float = 0.5
    """First retry delay; doubles each attempt, with jitter."""
    backoff_max_s: float = 8.0
    """Longest retry delay."""


class RetryableError(Exception):
    """A failure before any token arrived: safe to try again, here or on another replica."""


@dataclass
class Completion:
    """The text a request produced and its timing record."""

    text: str
    record: RequestRecord
    token_times: list[float] = field(default_factory=list, repr=False)
    replica_failed: bool = False
    """The replica could not be reached or broke the stream: worth retrying on another replica."""

    @property
    def ok(self) -> bool:
        return self.record.status == "ok"


class StreamingClient:
    """Streams completions from one replica (`base_url`) serving `model`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        run_id: str = "adhoc",
        replica: str | None = None,
        config: ClientConfig | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.run_id = run_id
        self.replica = replica or self.base_url
        self.config = config or ClientConfig()
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(
                self.config.read_timeout_s, connect=self.config.connect_timeout_s
            ),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self._owns_http = http is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(self, prompt: str | list[int], **kw) -> Completion:
        """Stream `/v1/completions` for a raw prompt (text or token ids)."""
        return await self._request("/v1/completions", {"prompt": prompt}, **kw)

    async def chat(self, messages: list[dict[str, str]], **kw) -> Completion:
        """Stream `/v1/chat/completions` for a list of `{role, content}` messages."""
        return await self._request("/v1/chat/completions", {"messages": messages}, **kw)

    async def _request(
        self,
        path: str,
        body: dict,
        *,
        max_tokens: int,
        cls: RequestClass = "chat",
        stage: Stage = "chat",
        doc_id: str | None = None,
        request_id: str | None = None,
        priority: int | None = None,
        ignore_eos: bool = False,
        temperature: float = 0.0,
        extra: dict | None = None,
        on_first_token: Callable[[], None] | None = None,
        stream_interval: int = 1,
    ) -> Completion:
        """`on_first_token` is called once, when the first token arrives: the prompt is in KV
        then (a batch worker tells the Gate its prefill is done).

        `stream_interval` > 1 asks the engine to send the first token at once and the rest in
        chunks of that many (vLLM's `stream_interval`): one message per chunk instead of per token,
        for the API server to serialize and for this client to parse. Token gaps are then not
        measured, so the record keeps TTFT and E2E and no gaps (a chunk's arrival is not a step)."""
        record = RequestRecord(
            run_id=self.run_id,
            request_id=request_id or uuid.uuid4().hex,
            cls=cls,
            stage=stage,
            replica=self.replica,
            doc_id=doc_id,
            t_submit=time.time(),
        )
        payload = {
            **body,
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "priority": priority if priority is not None else _default_priority(cls),
            "ignore_eos": ignore_eos,
            "return_token_ids": True,
            **({"stream_interval": stream_interval} if stream_interval > 1 else {}),
            **(extra or {}),
        }
        try:
            async with asyncio.timeout(self.config.total_timeout_s):
                done = await self._with_retries(path, payload, record, on_first_token)
        except TimeoutError:
            return _failed(
                record, "timeout", f"no answer within {self.config.total_timeout_s:.0f} s"
            )
        if stream_interval > 1:
            _drop_gaps(done.record)
        return done

    async def _with_retries(
        self,
        path: str,
        payload: dict,
        record: RequestRecord,
        on_first_token: Callable[[], None] | None,
    ) -> Completion:
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return await self._stream_once(path, payload, record, on_first_token)
            except RetryableError as exc:
                if attempt == self.config.retries:
                    done = _failed(record, "error", f"{exc} (after {attempt + 1} attempts)")
                    done.replica_failed = True
                    return done
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.config.backoff_max_s)
        raise AssertionError("unreachable")

    async def _stream_once(
        self,
        path: str,
        payload: dict,
        record: RequestRecord,
        on_first_token: Callable[[], None] | None = None,
    ) -> Completion:
        """One attempt. Raises RetryableError only while no token has arrived."""
        t0_wall, t0 = time.time(), time.perf_counter()
        token_times: list[float] = []
        pieces: list[str] = []
        try:
            async with self._http.stream("POST", self.base_url + path, json=payload) as resp:
                if resp.status_code in RETRY_STATUS:
                    raise RetryableError(f"HTTP {resp.status_code} from {self.replica}")
                if resp.status_code >= 400:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    return _failed(record, "error", f"HTTP {resp.status_code}: {detail}")
                async for chunk in _sse_chunks(resp):
                    now = t0_wall + (time.perf_counter() - t0)
                    first = not token_times
                    _absorb(chunk, now, record, token_times, pieces)
                    if first and token_times and on_first_token is not None:
                        on_first_token()
        except (
            httpx.ConnectError,
            httpx.ConnectTimeout,
            httpx.RemoteProtocolError,
            httpx.ReadError,
            httpx.ReadTimeout,
        ) as exc:
            if not token_times:
                raise RetryableError(f"{type(exc).__name__} from {self.replica}: {exc}") from exc
            done = _failed(
                record,
                "error",
                f"stream broke after {len(token_times)} tokens: {exc}",
                token_times,
                pieces,
            )
            done.replica_failed = True
            return done
        record.finish(token_times, t0_wall + (time.perf_counter() - t0))
        record.output_tokens = record.output_tokens or len(token_times)
        return Completion("".join(pieces), record, token_times)


def _drop_gaps(record: RequestRecord) -> None:
    """Forget the gaps between chunk arrivals: each spans several engine steps, and read as token
    gaps they would pass for an ITL that many times the real one."""
    record.gaps = []
    record.itl_p50_s = record.itl_p99_s = record.itl_max_s = None


def _default_priority(cls: RequestClass) -> int:
    return CHAT_PRIORITY if cls == "chat" else BATCH_PRIORITY


async def _sse_chunks(resp: httpx.Response) -> AsyncIterator[dict]:
    """The JSON objects of a server-sent-event stream, up to `[DONE]`."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise httpx.RemoteProtocolError(str(chunk["error"]))
        yield chunk


def _absorb(
    chunk: dict, now: float, record: RequestRecord, token_times: list[float], pieces: list[str]
) -> None:
    """Fold one stream chunk into the record: token arrivals, text, usage."""
    for choice in chunk.get("choices") or ():
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content") or ""
        ids = choice.get("token_ids")
        # One arrival per chunk that carries tokens: vLLM emits one chunk per engine step, and the
        # step is the unit of latency a user feels (ids can be empty text for partial UTF-8 bytes).
        if ids or text:
            token_times.append(now)
            pieces.append(text)
    usage = chunk.get("usage")
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens", 0)
        record.output_tokens = usage.get("completion_tokens", 0)
        details = usage.get("prompt_tokens_details") or {}
        record.cached_tokens = details.get("cached_tokens") or 0


def _failed(
    record: RequestRecord,
    status: str,
    error: str,
    token_times: list[float] | None = None,
    pieces: list[str] | None = None,
) -> Completion:
    record.finish(token_times or [], time.time())
    record.status = status  # type: ignore[assignment]
    record.error = error
    return Completion("".join(pieces or []), record, token_times or [])
