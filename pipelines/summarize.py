"""One document, start to finish: sections through Gate permits, then the reduce. Async, no Ray.

Each section is admitted before it is cut, so its size is the Gate's cap at that moment. A request
whose replica dies (connection refused, stream broken) is marked down at the Gate and sent again
under a new permit, which the Gate routes to a live replica; any other failure fails the document
with its reason, and the run goes on with the next one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from pipelines.config import PipelineConfig
from pipelines.errors import RunStopped
from pipelines.prompts import PromptKit
from pipelines.split import next_section, reduce_groups
from scheduler.records import RequestRecord, Stage
from serving.client import Completion, StreamingClient
from serving.tokenizer import Tokenizer


class GateClient(Protocol):
    """What a document needs from the Gate (an adapter over the Ray actor, or a local stand-in)."""

    async def acquire(self, doc_id: str, prompt_tokens: int, max_tokens: int) -> object: ...

    async def release(self, permit_id: str, row: dict | None, gaps: list[dict]) -> None: ...

    async def mark_down(self, replica: str) -> None: ...

    async def aborted(self) -> bool: ...

    async def prefilled(self, permit_id: str, tokens: int) -> None:
        """The permit's prompt is in KV (its first token arrived): the Gate may start the next
        batch prefill on that replica."""


class ClientPool(Protocol):
    def client(self, base_url: str, replica: str) -> StreamingClient: ...


class DocumentFailed(Exception):
    """A document that cannot be summarized; the message is the reason recorded for it."""


@dataclass
class DocOutcome:
    """What became of one document, with every request it made."""

    doc_id: str
    status: str = "done"
    reason: str | None = None
    summary: str = ""
    summary_tokens: int = 0
    sections: int = 0
    prompt_tokens: int = 0
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def batch_tokens(self) -> int:
        """Prompt plus output tokens this document's requests processed (the goodput unit)."""
        return sum(r.prompt_tokens + r.output_tokens for r in self.records)

    @property
    def replicas(self) -> list[str]:
        return sorted({r.replica for r in self.records if r.status == "ok"})


@dataclass
class DocumentJob:
    """Everything a document needs besides its tokens; one per worker, shared by its documents."""

    gate: GateClient
    clients: ClientPool
    tokenizer: Tokenizer
    kit: PromptKit
    config: PipelineConfig
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the run aborts: requests in flight are cancelled, their documents left to do."""

    async def summarize(self, doc_id: str, ids: list[int]) -> DocOutcome:
        out = DocOutcome(doc_id, prompt_tokens=len(ids))
        try:
            pieces, cap = await self._map(doc_id, ids, out)
            if len(pieces) > 1:
                pieces = await self._reduce(doc_id, pieces, cap, out)
            out.summary = pieces[0]
            out.summary_tokens = len(self.tokenizer.encode(out.summary))
        except DocumentFailed as exc:
            out.status, out.reason = "failed", str(exc)
        except RunStopped as exc:
            out.status, out.reason = "stopped", str(exc)
        return out

    async def _map(self, doc_id: str, ids: list[int], out: DocOutcome) -> tuple[list[str], int]:
        """Summaries of the document's sections (one piece when it went whole), and the last cap."""
        cfg, n = self.config, len(ids)
        pieces: list[str] = []
        start, cap = 0, cfg.max_model_len
        while start < n:
            hint = min(n - start, cap) + self.kit.overhead
            permit, done = await self._send(
                doc_id,
                hint,
                cfg.section_summary_tokens,
                lambda p, s=start: self._section_prompt(ids, s, p.chunk_tokens, out),
                out,
            )
            cap = permit.chunk_tokens
            pieces.append(done.text)
            out.sections += 1
            if done.record.stage == "whole":
                return pieces, cap
            _, start = next_section(n, start, self._section_cap(cap), cfg.overlap_tokens)
        return pieces, cap

    def _section_cap(self, chunk_tokens: int) -> int:
        """Document tokens per section under a cap on the tokens a request makes the replica
        prefill (the cached instruction is free), never below `min_section_tokens`."""
        return max(self.config.min_section_tokens, chunk_tokens - self.kit.uncached_overhead)

    def _section_prompt(
        self, ids: list[int], start: int, chunk_tokens: int, out: DocOutcome
    ) -> tuple[list[int], Stage, int]:
        """The prompt for the section at `start` under cap `chunk_tokens`, or the whole document."""
        cfg, n = self.config, len(ids)
        if start == 0 and self._goes_whole(n, chunk_tokens):
            return self.kit.whole(ids), "whole", cfg.final_summary_tokens
        end, _ = next_section(n, start, self._section_cap(chunk_tokens), cfg.overlap_tokens)
        return self.kit.section(ids[start:end]), "map", cfg.section_summary_tokens

    def _goes_whole(self, n: int, chunk_tokens: int) -> bool:
        cfg = self.config
        fits_context = n + self.kit.overhead + cfg.final_summary_tokens <= cfg.max_model_len
        if cfg.mode == "map_reduce" or not fits_context:
            return False
        return cfg.mode == "whole" or n + self.kit.overhead <= chunk_tokens

    async def _reduce(self, doc_id: str, pieces: list[str], cap: int, out: DocOutcome) -> list[str]:
        """Combine section summaries, in rounds when together they exceed the chunk cap."""
        cfg = self.config
        fixed = self.kit.reduce_size([])
        while len(pieces) > 1:
            ids = [self.tokenizer.encode(p) for p in pieces]
            groups = reduce_groups([len(i) for i in ids], cap, fixed, len(self.kit.separator))
            last_round = len(groups) == 1
            max_out = cfg.final_summary_tokens if last_round else cfg.section_summary_tokens
            merged: list[str] = []
            for group in groups:
                if len(group) == 1:
                    merged.append(pieces[group[0]])
                    continue
                prompt = self.kit.reduce([ids[i] for i in group])
                permit, done = await self._send(
                    doc_id,
                    len(prompt),
                    max_out,
                    lambda p, pr=prompt, m=max_out: (pr, "reduce", m),
                    out,
                )
                cap = permit.chunk_tokens
                merged.append(done.text)
            pieces = merged
        return pieces

    async def _send(
        self, doc_id: str, prompt_hint: int, max_tokens: int, make_prompt, out: DocOutcome
    ) -> tuple[object, Completion]:
        """Acquire a permit, build the prompt for it, stream it, release; move on a dead replica."""
        last_error = "no attempt made"
        for _ in range(self.config.attempts_per_request):
            try:
                permit = await self.gate.acquire(doc_id, prompt_hint, max_tokens)
            except RunStopped:
                raise
            except (RuntimeError, ValueError, TimeoutError) as exc:
                raise DocumentFailed(f"no batch seat: {exc}") from exc
            prompt, stage, n_out = make_prompt(permit)
            done = await self._stream(permit, doc_id, prompt, stage, n_out)
            out.records.append(done.record)
            await self.gate.release(
                permit.permit_id,
                done.record.row(),
                [{"t": g.t, "gap_s": g.gap_s} for g in done.record.gaps],
            )
            if done.ok:
                return permit, done
            last_error = done.record.error or done.record.status
            if not done.replica_failed:
                raise DocumentFailed(f"{stage} request failed on {permit.replica}: {last_error}")
            await self.gate.mark_down(permit.replica)
        raise DocumentFailed(
            f"gave up after {self.config.attempts_per_request} replicas: {last_error}"
        )

    async def _stream(
        self, permit, doc_id: str, prompt: list[int], stage: Stage, max_tokens: int
    ) -> Completion:
        """Stream one request, cancelled (closing the connection, so the engine drops it too)
        if the run aborts meanwhile."""
        client = self.clients.client(permit.base_url, permit.replica)
        reports: list[asyncio.Future] = []

        def prefilled() -> None:
            reports.append(
                asyncio.ensure_future(self.gate.prefilled(permit.permit_id, len(prompt)))
            )

        request = asyncio.ensure_future(
            client.complete(
                prompt,
                max_tokens=max_tokens,
                cls="batch",
                stage=stage,
                doc_id=doc_id,
                priority=permit.priority,
                ignore_eos=self.config.ignore_eos,
                on_first_token=prefilled,
                stream_interval=self.config.batch_stream_interval,
            )
        )
        aborted = asyncio.ensure_future(self.abort.wait())
        await asyncio.wait({request, aborted}, return_when=asyncio.FIRST_COMPLETED)
        aborted.cancel()
        if request.done():
            await asyncio.gather(*reports, return_exceptions=True)  # a lost report only delays
            return request.result()
        request.cancel()
        await self.gate.release(permit.permit_id, None, [])
        raise RunStopped("run aborted with the request in flight")
