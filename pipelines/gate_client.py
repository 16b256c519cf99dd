"""Worker-side handles: the Gate actor as an awaitable object, and one HTTP client per replica."""

from __future__ import annotations

import httpx
from ray.exceptions import RayTaskError

from serving.client import ClientConfig, StreamingClient


class RayGateClient:
    """The run's Gate actor behind plain async methods (a Ray ObjectRef is awaitable).

    With a `holder` (the worker's id) its seats are held on a lease that `aborted`, polled by the
    worker, renews (`pipelines/seat_leases.py`): a worker that dies gives its seats back.

    An error the Gate raises comes back as itself (`RunStopped`, `TimeoutError`, ...), chained to
    Ray's wrapper: the wrapper's message is the whole remote traceback in terminal colours, and a
    document's failure reason, which users read in the run's tables, is built from the message.
    A Gate that died still raises Ray's own `RayActorError`."""

    def __init__(
        self, handle, acquire_timeout_s: float | None = None, holder: str | None = None
    ) -> None:
        self._gate = handle
        self._timeout = acquire_timeout_s
        self._holder = holder

    async def acquire(
        self, doc_id: str, prompt_tokens: int, max_tokens: int, stage: str | None = None
    ):
        return await _gate_call(
            self._gate.acquire.remote(
                doc_id, prompt_tokens, max_tokens, self._timeout, stage, self._holder
            )
        )

    async def release(self, permit_id: str, row: dict, gaps: list[dict]) -> None:
        await _gate_call(self._gate.release.remote(permit_id, row, gaps))

    async def mark_down(self, replica: str) -> None:
        await _gate_call(self._gate.mark_down.remote(replica))

    async def aborted(self) -> bool:
        if self._holder is None:
            return await _gate_call(self._gate.aborted.remote())
        return await _gate_call(self._gate.heartbeat.remote(self._holder))

    async def prefilled(self, permit_id: str, tokens: int) -> None:
        await _gate_call(self._gate.progress.remote(permit_id, tokens, tokens))


async def _gate_call(call):
    """Await one actor call, raising what the Gate raised rather than Ray's wrapper of it."""
    try:
        return await call
    except RayTaskError as exc:
        if isinstance(exc.cause, Exception):
            raise exc.cause from exc
        raise


BATCH_CLIENT = ClientConfig(read_timeout_s=1800.0)
"""Batch requests wait as long as a request may take for their next chunk: under the engine
plug-in a batch prefill is paused, or granted nothing, whenever chat needs the steps, so minutes
of silence are the controller at work, not a dead replica (which refuses or drops the
connection)."""


class HttpClientPool:
    """One StreamingClient per replica over one shared connection pool."""

    def __init__(
        self,
        model: str,
        run_id: str,
        config: ClientConfig | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        self.run_id = run_id
        self.config = config or BATCH_CLIENT
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(
                self.config.read_timeout_s, connect=self.config.connect_timeout_s
            ),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            headers=headers,
        )
        self._clients: dict[str, StreamingClient] = {}

    def client(self, base_url: str, replica: str) -> StreamingClient:
        if base_url not in self._clients:
            self._clients[base_url] = StreamingClient(
                base_url,
                self.model,
                run_id=self.run_id,
                replica=replica,
                config=self.config,
                http=self._http,
            )
        return self._clients[base_url]

    async def aclose(self) -> None:
        await self._http.aclose()
