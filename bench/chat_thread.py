"""Production-shaped chat load running beside a batch run, on a thread of its own.

The batch driver blocks on Ray, so the chat load gets its own event loop in a background thread.
Every chat request that ends is reported to the run's Gate when one exists, so the controller sees
exact chat ITL and TTFT (the engine's own histograms mix chat with batch).
"""

from __future__ import annotations

import asyncio
import threading

from bench.chat_load import ChatLoadSpec, run_chat_load
from bench.chat_results import ChatLoadResult
from scheduler.records import RequestRecord


class ChatLoadThread:
    """`start()` the load, `stop()` it early or `join()` it; both return the result."""

    def __init__(
        self,
        replicas: list[tuple[str, str]],
        model: str,
        tokenizer,
        spec: ChatLoadSpec,
        run_id: str,
        gate_run_id: str | None = None,
    ) -> None:
        self._args = (replicas, model, tokenizer, spec, run_id)
        self._gate_run_id = gate_run_id
        self._gate = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._result: ChatLoadResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="chat-load", daemon=True)

    def start(self) -> ChatLoadThread:
        self._thread.start()
        self._ready.wait()
        return self

    def stop(self) -> ChatLoadResult:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        return self.join()

    def join(self) -> ChatLoadResult:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _main(self) -> None:
        try:
            asyncio.run(self._play())
        except BaseException as exc:  # surfaced to the caller by join()
            self._error = exc
            self._ready.set()

    async def _play(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        self._result = await run_chat_load(*self._args, stop=self._stop, on_record=self._report)

    def _report(self, record: RequestRecord) -> None:
        gate = self._find_gate()
        if gate is not None:
            gate.report.remote(record.row(), [{"t": g.t, "gap_s": g.gap_s} for g in record.gaps])

    def _find_gate(self):
        """The run's Gate once it exists (it starts with the batch job, after the chat load)."""
        if self._gate is None and self._gate_run_id is not None:
            import ray

            from pipelines.gate import gate_name

            if ray.is_initialized():
                try:
                    self._gate = ray.get_actor(gate_name(self._gate_run_id))
                except ValueError:
                    return None
        return self._gate
