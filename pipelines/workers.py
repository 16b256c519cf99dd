"""The Ray Data stage: summarize documents through the Gate.

A callable class, so that each Ray actor loads the tokenizer (and opens its connection pool) once,
not once per batch. It is an async UDF: Ray Data runs several of its calls at once per actor
(`docs_per_actor`), which is what keeps enough documents waiting at the Gate for it to fill every
seat it opens. Each document is tokenized by the call that summarizes it, in a thread (the
tokenizer releases the GIL, and the actor's other documents keep streaming meanwhile): the first
summary of a night, or of a retried attempt, starts as soon as one document is read, not after
the whole corpus has been tokenized (which took minutes on a night of tens of thousands).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pyarrow as pa

from pipelines.config import PipelineConfig
from pipelines.corpus import document_texts
from pipelines.prompts import PromptKit
from pipelines.summarize import DocOutcome, DocumentJob
from serving.engine_config import load_engine_config
from serving.replica_auth import ReplicaAuth
from serving.tokenizer import tokenizer_for

OUTCOME_COLUMNS = (
    "doc_id",
    "status",
    "reason",
    "summary",
    "summary_tokens",
    "sections",
    "prompt_tokens",
    "batch_tokens",
    "replicas",
    "requests",
    "gaps",
    "t_done",
)


class Summarize:
    """Summarizes one document per call, through the run's Gate; returns its outcome row."""

    def __init__(
        self,
        run_id: str,
        engine_config: str,
        config: dict,
        replica_url: str | None = None,
        auth: ReplicaAuth | None = None,
    ) -> None:
        import ray

        from pipelines.gate import gate_name
        from pipelines.gate_client import HttpClientPool, RayGateClient

        cfg = PipelineConfig.model_validate(config)
        engine = load_engine_config(engine_config)
        tokenizer = tokenizer_for(engine, replica_url)
        self.run_id = run_id
        self.job = DocumentJob(
            gate=RayGateClient(
                ray.get_actor(gate_name(run_id)), cfg.acquire_timeout_s, holder=_worker_id(ray)
            ),
            clients=HttpClientPool(
                engine.model.served_name, run_id, headers=(auth or ReplicaAuth()).http_headers()
            ),
            tokenizer=tokenizer,
            kit=PromptKit.build(tokenizer),
            config=cfg,
        )

        self._watcher = None

    async def __call__(self, batch: pa.Table) -> dict[str, list]:
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch_abort())
        rows = []
        # The driver passes only documents with valid UTF-8 text (`pipelines.corpus.classify`).
        for doc_id, text in zip(
            batch.column("doc_id").to_pylist(), document_texts(batch), strict=True
        ):
            ids = await asyncio.to_thread(self.job.tokenizer.encode, text or "")
            rows.append(await self.job.summarize(str(doc_id), ids))
        return {c: [outcome_row(o)[c] for o in rows] for c in OUTCOME_COLUMNS}

    async def _watch_abort(self, every_s: float = 0.5) -> None:
        """Poll the Gate so requests in flight are cancelled soon after the run aborts; each poll
        also renews this worker's seat lease, so the Gate takes back the seats of a worker that
        dies (`pipelines/seat_leases.py`)."""
        while not self.job.abort.is_set():
            if await self.job.gate.aborted():
                self.job.abort.set()
            await asyncio.sleep(every_s)


def _worker_id(ray) -> str:
    """This worker's holder id at the Gate: its Ray actor id and a part new to this process. Ray
    restarts a dead actor under the same actor id; the restarted one must not renew the lease of
    the seats its dead predecessor held."""
    return f"{ray.get_runtime_context().get_actor_id()}-{uuid.uuid4().hex[:8]}"


def outcome_row(o: DocOutcome) -> dict:
    """A document's outcome as one row; its request records and gaps travel as JSON text so that
    a row of any size fits a Ray Data block without a nested schema."""
    gaps = [
        {"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t}
        for r in o.records
        for g in r.gaps
    ]
    return {
        "doc_id": o.doc_id,
        "status": o.status,
        "reason": o.reason,
        "summary": o.summary,
        "summary_tokens": o.summary_tokens,
        "sections": o.sections,
        "prompt_tokens": o.prompt_tokens,
        "batch_tokens": o.batch_tokens,
        "replicas": json.dumps(o.replicas),
        "requests": json.dumps([r.row() for r in o.records]),
        "gaps": json.dumps(gaps),
        "t_done": time.time(),
    }
