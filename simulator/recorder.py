"""Request, token-gap and decision records of a simulated run, in the docs/design.md §4.5 shapes.

Token gaps are kept as one NumPy array per request rather than `TokenGap` objects: an hour of chat
streams millions of tokens. `write_parquet` lays them out as the same three tables the pipeline
writes, so the SQL reports read simulated and real runs alike: the columns are the run schemas of
`scheduler.run_schemas`, which the warehouse loads by.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from scheduler.admission import Decision, Observation
from scheduler.records import RequestRecord, percentile
from scheduler.run_schemas import DECISIONS, DOCUMENTS, REQUESTS, TOKEN_GAPS
from simulator.entities import Request

REQUEST_SCHEMA = REQUESTS
DECISION_SCHEMA = DECISIONS
DOCUMENT_SCHEMA = DOCUMENTS
GAP_SCHEMA = pa.schema(
    [
        f.with_type(pa.dictionary(pa.int32(), pa.string())) if f.name in ("run_id", "request_id")
        else f
        for f in TOKEN_GAPS
    ]
)  # fmt: skip
"""The token-gap columns, with the ids dictionary-encoded: millions of gaps share a few ids."""
_EMPTY = np.zeros(0)


class Recorder:
    """Collects one record per request (with its gaps) and one row per controller decision."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.records: list[RequestRecord] = []
        self.gaps: list[np.ndarray] = []
        self.gap_times: list[np.ndarray] = []
        self.decisions: list[dict] = []

    def finish(
        self, req: Request, now: float, status: str = "ok", error: str | None = None
    ) -> None:
        """Record `req`; `now` is its end, or the end of the run when it is still in flight."""
        times = np.asarray(req.token_times, dtype=float)
        rec = RequestRecord(
            run_id=self.run_id,
            request_id=req.request_id,
            cls=req.cls,
            stage=req.stage,
            replica=req.replica,
            doc_id=req.doc_id,
            prompt_tokens=req.prompt_tokens,
            cached_tokens=req.cached_tokens or 0,
            output_tokens=req.output_tokens,
            t_submit=req.arrival,
            status=status,
            error=error,
        )
        if status == "ok":
            rec.t_end, rec.e2e_s = now, now - req.arrival
        if len(times):
            rec.t_first_token = float(times[0])
            rec.ttft_s = float(times[0]) - req.arrival
        gaps = np.diff(times) if len(times) > 1 else _EMPTY
        if len(gaps):
            ordered = np.sort(gaps).tolist()
            rec.itl_p50_s = percentile(ordered, 50)
            rec.itl_p99_s = percentile(ordered, 99)
            rec.itl_max_s = ordered[-1]
        self.records.append(rec)
        self.gaps.append(gaps)
        self.gap_times.append(times[1:] if len(gaps) else _EMPTY)

    def decision(self, obs: Observation, d: Decision) -> None:
        self.decisions.append(
            {
                "run_id": self.run_id,
                "t": obs.t,
                "replica": obs.replica,
                "batch_seats": d.batch_seats,
                "chunk_tokens": d.chunk_tokens,
                "pause": d.pause,
                "reason": d.reason,
                "predicted_step_ms": d.predicted_step_ms,
                "observed_itl_p99_s": obs.chat_itl_p99_s,
                "observed_ttft_p99_s": obs.chat_ttft_p99_s,
                "observed_kv_usage": obs.kv_usage,
                "prefill_budget_tokens": d.prefill_budget_tokens,
                "batch_step_target_ms": d.batch_step_target_ms,
                "kv_room_tokens": d.kv_room_tokens,
                "observed_target_bound_share": obs.target_bound_share,
                "observed_chat_cache_tokens": obs.chat_cache_tokens,
                "slack_mark": d.slack_mark,
                "mean_step_target_ms": d.mean_step_target_ms,
            }
        )

    def class_gaps(self, cls: str) -> tuple[np.ndarray, np.ndarray]:
        """All token gaps of one request class and the times they ended."""
        keep = [i for i, r in enumerate(self.records) if r.cls == cls]
        if not keep:
            return _EMPTY, _EMPTY
        return (
            np.concatenate([self.gaps[i] for i in keep]),
            np.concatenate([self.gap_times[i] for i in keep]),
        )

    def tables(self, documents: list[dict]) -> dict[str, pa.Table]:
        """The run's tables (requests, token_gaps, decisions, documents) as Arrow tables."""
        return {
            "requests": pa.Table.from_pylist(
                [r.row() for r in self.records], schema=REQUEST_SCHEMA
            ),
            "token_gaps": self._gap_table(),
            "decisions": pa.Table.from_pylist(self.decisions, schema=DECISION_SCHEMA),
            "documents": pa.Table.from_pylist(documents, schema=DOCUMENT_SCHEMA),
        }

    def _gap_table(self) -> pa.Table:
        lengths = np.array([len(g) for g in self.gaps], dtype=np.int64)
        total = int(lengths.sum())
        owner = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        ids = pa.array([r.request_id for r in self.records], type=pa.string())
        gaps = np.concatenate(self.gaps) if total else _EMPTY
        times = np.concatenate(self.gap_times) if total else _EMPTY
        return pa.Table.from_arrays(
            [
                pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(total, dtype=np.int32)), pa.array([self.run_id])
                ),
                pa.DictionaryArray.from_arrays(pa.array(owner, type=pa.int32()), ids),
                pa.array((np.arange(total) - starts).astype(np.int32)),
                pa.array(gaps, type=pa.float64()),
                pa.array(times, type=pa.float64()),
            ],
            schema=GAP_SCHEMA,
        )
