"""One document, start to finish: whole, or sections then reduces, each through a Gate permit.

A document's structure (whole or map-reduce, and where its sections are cut) depends only on the
job's settings and the document, never on the load: `DocumentJob.layout` decides it before the
first request, and a permit's caps are never read to size a prompt. The engine's scheduler sizes
each step's batch prefill chunk, so a long prompt cannot crowd chat out of a step and there is no
reason to cut it smaller while chat is busy; the Gate only decides when and where each request
runs. A request whose replica dies (connection refused, stream broken) is marked down at the Gate
and sent again under a new permit, which the Gate routes to a live replica; any other failure
fails the document with its reason, and the run goes on with the next one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pipelines.config import PipelineConfig
from pipelines.corpus import over_long_reason
from pipelines.errors import RunStopped
from pipelines.prompts import PromptKit
from pipelines.split import reduce_groups, sections
from scheduler.records import RequestRecord, Stage
from serving.client import Completion, StreamingClient
from serving.tokenizer import Tokenizer


def cache_salt(salt: str | None) -> dict | None:
    """The request fields that keep a batch prompt's prefix cache to requests salted alike."""
    return {"cache_salt": salt} if salt else None


class GateClient(Protocol):
    """What a document needs from the Gate (an adapter over the Ray actor, or a local stand-in)."""

    async def acquire(
        self, doc_id: str, prompt_tokens: int, max_tokens: int, stage: str | None = None
    ) -> object:
        """A permit for one request; `stage` goes to the run's request journal."""

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


@dataclass(frozen=True)
class Layout:
    """How one document is sent: one `whole` request, or `map` requests over `sections` (each
    `[start, end)` in document tokens) whose summaries are then reduced."""

    stage: Literal["whole", "map"]
    sections: tuple[tuple[int, int], ...]


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
            layout = self.layout(len(ids))
            if layout.stage == "whole":
                prompt = self.kit.whole(ids)
                done = await self._send(
                    doc_id, prompt, "whole", self.config.final_summary_tokens, out
                )
                out.sections = 1
                pieces = [done.text]
            else:
                pieces = await self._map(doc_id, ids, layout.sections, out)
                pieces = await self._reduce(doc_id, pieces, out)
            out.summary = pieces[0]
            out.summary_tokens = len(self.tokenizer.encode(out.summary))
        except DocumentFailed as exc:
            out.status, out.reason = "failed", str(exc)
        except RunStopped as exc:
            out.status, out.reason = "stopped", str(exc)
        return out

    def layout(self, n_tokens: int) -> Layout:
        """How a document of `n_tokens` tokens is sent, from the job's settings alone.

        Whole when `mode` allows it and the whole prompt plus the summary fit `max_model_len`;
        otherwise (`auto`, `map_reduce`) in sections of `section_size()` tokens. Raises
        `DocumentFailed` for a document the job cannot take: longer than `max_doc_tokens`, empty,
        or too long for the context under `mode: whole`. Nothing here looks at the load, so the
        same document under the same job is always sent the same way."""
        cfg = self.config
        if n_tokens > cfg.max_doc_tokens:
            raise DocumentFailed(over_long_reason(n_tokens, cfg.max_doc_tokens))
        if n_tokens == 0:
            raise DocumentFailed("empty document: no tokens to summarize")
        if cfg.mode != "map_reduce":
            prompt = n_tokens + self.kit.whole_overhead
            if prompt + cfg.final_summary_tokens <= cfg.max_model_len:
                return Layout("whole", ((0, n_tokens),))
            if cfg.mode == "whole":
                raise DocumentFailed(
                    f"too long to send whole: a prompt of {prompt} tokens plus "
                    f"{cfg.final_summary_tokens} summary tokens exceeds max_model_len "
                    f"{cfg.max_model_len}; set mode to auto or map_reduce to send it in sections, "
                    "or serve a model with a longer context"
                )
        return Layout("map", tuple(sections(n_tokens, self.section_size(), cfg.overlap_tokens)))

    def section_size(self) -> int:
        """Document tokens per section: `section_tokens`, or less only when `max_model_len` cannot
        hold a section prompt that large with its summary. A job setting, the same for every
        section of every document."""
        cfg = self.config
        room = cfg.max_model_len - self.kit.section_overhead - cfg.section_summary_tokens
        if room < 1:
            raise DocumentFailed(
                f"max_model_len {cfg.max_model_len} cannot hold a section prompt "
                f"({self.kit.section_overhead} tokens around the section) and its "
                f"{cfg.section_summary_tokens} summary tokens; lower section_summary_tokens or "
                "serve a model with a longer context"
            )
        return min(cfg.section_tokens, room)

    async def _map(
        self,
        doc_id: str,
        ids: list[int],
        spans: tuple[tuple[int, int], ...],
        out: DocOutcome,
    ) -> list[str]:
        """Summaries of the document's sections, one request each, in order."""
        pieces: list[str] = []
        for start, end in spans:
            prompt = self.kit.section(ids[start:end])
            done = await self._send(doc_id, prompt, "map", self.config.section_summary_tokens, out)
            pieces.append(done.text)
            out.sections += 1
        return pieces

    async def _reduce(self, doc_id: str, pieces: list[str], out: DocOutcome) -> list[str]:
        """Combine section summaries, in rounds when together they do not fit one prompt.

        Each group's reduce prompt plus its output fits `max_model_len` (room is kept for the
        larger of the two output lengths, as a group does not know yet whether its round is the
        last); like the sections, the grouping depends on the job and the summaries only."""
        cfg = self.config
        fixed = self.kit.reduce_size([])
        budget = cfg.max_model_len - max(cfg.final_summary_tokens, cfg.section_summary_tokens)
        while len(pieces) > 1:
            ids = [self.tokenizer.encode(p) for p in pieces]
            groups = reduce_groups([len(i) for i in ids], budget, fixed, len(self.kit.separator))
            last_round = len(groups) == 1
            max_out = cfg.final_summary_tokens if last_round else cfg.section_summary_tokens
            merged: list[str] = []
            for group in groups:
                if len(group) == 1:
                    merged.append(pieces[group[0]])
                    continue
                prompt = self.kit.reduce([ids[i] for i in group])
                if len(prompt) + max_out > cfg.max_model_len:
                    raise DocumentFailed(
                        f"reduce prompt of {len(prompt)} tokens plus {max_out} output tokens "
                        f"exceeds max_model_len {cfg.max_model_len} even for two summaries; "
                        "lower section_summary_tokens"
                    )
                done = await self._send(doc_id, prompt, "reduce", max_out, out)
                merged.append(done.text)
            pieces = merged
        return pieces

    async def _send(
        self, doc_id: str, prompt: list[int], stage: Stage, max_tokens: int, out: DocOutcome
    ) -> Completion:
        """Acquire a permit, stream the prompt under it, release; move on a dead replica. The
        prompt is the same whatever the permit says: its caps never resize a request."""
        last_error = "no attempt made"
        for _ in range(self.config.attempts_per_request):
            try:
                permit = await self.gate.acquire(doc_id, len(prompt), max_tokens, stage)
            except RunStopped:
                raise
            except (RuntimeError, ValueError, TimeoutError) as exc:
                raise DocumentFailed(f"no batch seat: {exc}") from exc
            done = await self._stream(permit, doc_id, prompt, stage, max_tokens)
            out.records.append(done.record)
            await self.gate.release(
                permit.permit_id,
                done.record.row(),
                [{"t": g.t, "gap_s": g.gap_s} for g in done.record.gaps],
            )
            if done.ok:
                return done
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
                extra=cache_salt(self.config.batch_cache_salt),
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
