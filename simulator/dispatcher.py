"""Batch admission under the policy's caps: the simulated counterpart of the pipeline's Gate.

Each replica has the caps of its latest decision: at most `batch_seats` batch requests in flight,
and KV room (`kv_room_tokens`) that a request's prompt and output must fit, checked at every grant
as the Gate does. In `map` mode a document is cut into sections of the job's `section_tokens`
(or a baseline's smaller `chunk_tokens`: the static-engine policy's section size), one request each;
once all sections are summarized, a `reduce` request turns their summaries into the document's
summary (as the pipeline's map-reduce does). In `whole` mode a document is one request; the engine
plug-in sizes its prefill chunks every step (`EngineScheduler.batch_target`), and a baseline's
`chunk_tokens` caps them as an engine-wide chunk size would. `pause` admits nothing new; what is in
flight runs on, since a sent request cannot be recalled. A decision's `prefill_budget_tokens`
holds back a request until the batch prompt tokens still awaiting prefill leave room for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from scheduler.admission import Decision, within_prefill_budget
from simulator.config import BatchWorkload
from simulator.entities import BATCH_PRIORITY, Request, Segment

INSTRUCTION = ("instruction",)


@dataclass(slots=True)
class Document:
    """One backlog document and how much of it has been handed out and finished."""

    doc_id: str
    tokens: int
    cut: int = 0
    sections: int = 0
    sections_done: int = 0
    failed: bool = False
    t_done: float | None = None

    @property
    def all_cut(self) -> bool:
        return self.cut == self.tokens


@dataclass(slots=True)
class ReplicaSeats:
    """One replica's caps and the batch requests it holds now."""

    decision: Decision | None = None
    in_flight: list[Request] = field(default_factory=list)


class BatchDispatcher:
    """Hands out batch requests per replica within that replica's current decision."""

    def __init__(self, cfg: BatchWorkload, replicas: list[str]) -> None:
        self.cfg = cfg
        self.seats = {name: ReplicaSeats() for name in replicas}
        self.queue: deque[Document] = deque()
        self.reduces: deque[Document] = deque()
        self.docs: dict[str, Document] = {}

    def add_backlog(self, count: int, tokens: int) -> None:
        for _ in range(count):
            doc = Document(f"doc-{len(self.docs):05d}", tokens)
            self.docs[doc.doc_id] = doc
            self.queue.append(doc)

    def set_decision(self, replica: str, decision: Decision) -> None:
        seats = self.seats[replica]
        seats.decision = decision
        if self.cfg.mode == "whole":
            for req in seats.in_flight:
                req.chunk_cap = decision.chunk_tokens

    def admit(self, replica: str, now: float) -> list[Request]:
        """New batch requests for `replica` that its caps allow right now; reduces go first, since
        they finish documents."""
        seats = self.seats[replica]
        d = seats.decision
        if d is None or d.pause:
            return []
        new: list[Request] = []
        pending = sum(max(0, r.prompt_tokens - r.num_computed) for r in seats.in_flight)
        room = d.kv_room_tokens
        section = min(d.chunk_tokens, self.cfg.section_tokens)
        while (self.reduces or self.queue) and len(seats.in_flight) < d.batch_seats:
            size = self._next_prompt_tokens(section)
            if not within_prefill_budget(pending, size, d.prefill_budget_tokens):
                break
            need = size + self._next_output_tokens(section)
            if room is not None and need > room:
                break
            pending += size
            room = None if room is None else room - need
            if self.reduces:
                req = self._reduce(self.reduces.popleft(), now)
            else:
                req = self._next_section(self.queue[0], section, d.chunk_tokens, now)
            req.replica = replica
            seats.in_flight.append(req)
            new.append(req)
        return new

    def _next_prompt_tokens(self, chunk_tokens: int) -> int:
        """Prompt tokens of the request `admit` would make next (a reduce, else a section)."""
        if self.reduces:
            body = self.reduces[0].sections * self.cfg.section_summary_tokens
        else:
            doc = self.queue[0]
            remaining = doc.tokens - doc.cut
            body = remaining if self.cfg.mode == "whole" else min(max(1, chunk_tokens), remaining)
        return self.cfg.instruction_tokens + body

    def _next_output_tokens(self, section_tokens: int) -> int:
        """Output tokens of the request `admit` would make next."""
        if self.reduces:
            return self.cfg.summary_tokens
        doc = self.queue[0]
        whole = self.cfg.mode == "whole" or (doc.cut == 0 and doc.tokens <= section_tokens)
        return self.cfg.summary_tokens if whole else self.cfg.section_summary_tokens

    def _next_section(
        self, doc: Document, section_tokens: int, chunk_tokens: int, now: float
    ) -> Request:
        remaining = doc.tokens - doc.cut
        size = remaining if self.cfg.mode == "whole" else min(max(1, section_tokens), remaining)
        stage = "whole" if size == doc.tokens else "map"
        index = doc.sections
        doc.cut += size
        doc.sections += 1
        if doc.all_cut:
            self.queue.popleft()
        output = self.cfg.summary_tokens if stage == "whole" else self.cfg.section_summary_tokens
        req = self._request(doc, stage, index, Segment((doc.doc_id, index), size), output, now)
        req.chunk_cap = chunk_tokens if self.cfg.mode == "whole" else 0
        return req

    def _reduce(self, doc: Document, now: float) -> Request:
        summaries = Segment(
            ("summaries", doc.doc_id), doc.sections * self.cfg.section_summary_tokens
        )
        return self._request(doc, "reduce", doc.sections, summaries, self.cfg.summary_tokens, now)

    def _request(
        self, doc: Document, stage: str, index: int, body: Segment, output: int, now: float
    ) -> Request:
        segments = (Segment(INSTRUCTION, self.cfg.instruction_tokens), body)
        return Request(
            request_id=f"{doc.doc_id}-{stage}-{index}",
            cls="batch",
            stage=stage,
            priority=BATCH_PRIORITY,
            arrival=now,
            segments=tuple(s for s in segments if s.length),
            max_output=output,
            output_key=("summary", doc.doc_id, index),
            doc_id=doc.doc_id,
        )

    def finished(self, req: Request, now: float, ok: bool) -> None:
        """Free `req`'s seat; a document is done with its reduce, or its only section."""
        seats = self.seats[req.replica]
        seats.in_flight = [r for r in seats.in_flight if r is not req]
        doc = self.docs[req.doc_id]
        if not ok and not doc.failed and not doc.all_cut:
            self.queue.remove(doc)  # a failed document is not worth its remaining sections
        doc.failed = doc.failed or not ok
        if req.stage == "reduce" or req.stage == "whole":
            doc.t_done = None if doc.failed else now
            return
        doc.sections_done += 1
        if doc.all_cut and doc.sections_done == doc.sections and not doc.failed:
            self.reduces.append(doc)

    @property
    def docs_done(self) -> int:
        return sum(1 for d in self.docs.values() if d.t_done is not None)

    def document_rows(self, run_id: str) -> list[dict]:
        """One row per backlog document in the warehouse's `documents` shape."""
        return [_document_row(run_id, d, self.cfg.summary_tokens) for d in self.docs.values()]


def _document_row(run_id: str, d: Document, summary_tokens: int) -> dict:
    if d.failed:
        status, reason = "failed", "a request of the document was rejected by the engine"
    elif d.t_done is not None:
        status, reason = "done", None
    else:
        status, reason = "skipped", "the simulated run ended first"
    return {
        "run_id": run_id,
        "doc_id": d.doc_id,
        "status": status,
        "reason": reason,
        "prompt_tokens": d.tokens,
        "sections": d.sections,
        "summary_tokens": summary_tokens if status == "done" else None,
        "t_done": d.t_done,
    }
