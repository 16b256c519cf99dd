"""Arrow schemas of every table a run writes and the warehouse holds (docs/design.md §4.5).

The one declaration of the run tables' columns: the pipeline, the chat-load generator, the
simulator's recorder and the warehouse all read them here, so a column added or retyped changes
every producer and the loader together. It lives in `scheduler`, the bottom of the dependency
graph, because the simulator may not import `warehouse`; it declares shapes and does no I/O.
The request columns are `scheduler.records.RequestRecord`'s, and a unit test checks they agree.
"""

from __future__ import annotations

import pyarrow as pa

DOCUMENTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("doc_id", pa.string()),
        ("status", pa.string()),  # 'done' | 'failed' | 'skipped'
        ("reason", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("sections", pa.int64()),
        ("summary_tokens", pa.int64()),
        ("t_done", pa.float64()),
    ]
)

SUMMARIES = pa.schema(
    [
        ("run_id", pa.string()),
        ("doc_id", pa.string()),
        ("summary", pa.string()),
        ("summary_tokens", pa.int64()),
        ("sections", pa.int64()),
        ("replicas", pa.list_(pa.string())),  # every replica that served a section of the document
    ]
)

REQUESTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("request_id", pa.string()),
        ("class", pa.string()),  # 'chat' | 'batch'
        ("stage", pa.string()),  # 'chat' | 'map' | 'reduce' | 'whole'
        ("replica", pa.string()),
        ("doc_id", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("t_submit", pa.float64()),
        ("t_first_token", pa.float64()),
        ("t_end", pa.float64()),
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("itl_p50_s", pa.float64()),
        ("itl_p99_s", pa.float64()),
        ("itl_max_s", pa.float64()),
        ("status", pa.string()),  # 'ok' | 'error' | 'timeout' | 'cancelled'
        ("error", pa.string()),
    ]
)

TOKEN_GAPS = pa.schema(
    [
        ("run_id", pa.string()),
        ("request_id", pa.string()),
        ("idx", pa.int32()),
        ("gap_s", pa.float64()),
        ("t", pa.float64()),
    ]
)

DECISIONS = pa.schema(
    [
        ("run_id", pa.string()),
        ("t", pa.float64()),
        ("replica", pa.string()),
        ("batch_seats", pa.int64()),
        ("chunk_tokens", pa.int64()),
        ("pause", pa.bool_()),
        ("observed_itl_p99_s", pa.float64()),
        ("observed_ttft_p99_s", pa.float64()),
        ("observed_kv_usage", pa.float64()),
        ("predicted_step_ms", pa.float64()),
        ("reason", pa.string()),
        ("prefill_budget_tokens", pa.int64()),
        ("batch_step_target_ms", pa.float64()),
        ("kv_room_tokens", pa.int64()),
        ("observed_target_bound_share", pa.float64()),
        ("observed_chat_cache_tokens", pa.int64()),
        ("slack_mark", pa.float64()),
        ("mean_step_target_ms", pa.float64()),
    ]
)

ENGINE_STEPS = pa.schema(
    [
        ("run_id", pa.string()),
        ("t", pa.float64()),
        ("replica", pa.string()),
        ("state", pa.string()),
        ("control_seq", pa.int64()),
        ("batch_step_target_ms", pa.float64()),
        ("steps", pa.int64()),
        ("mean_step_ms", pa.float64()),
        ("step_time_ratio", pa.float64()),
        ("batch_prefill_tokens", pa.int64()),
        ("batch_tokens_per_step", pa.float64()),
        ("chat_itl_p99_s", pa.float64()),
        ("target_bound_steps", pa.int64()),
        ("chat_cache_tokens", pa.int64()),
    ]
)

ENGINE_ITL = pa.schema(
    [
        ("run_id", pa.string()),
        ("replica", pa.string()),
        ("t0", pa.float64()),
        ("t1", pa.float64()),
        ("le_low", pa.float64()),
        ("le", pa.float64()),
        ("count", pa.int64()),
    ]
)

ENGINE_TTFT = ENGINE_ITL
"""The plug-in's chat-only TTFT histogram, in the same shape as ENGINE_ITL."""

# Tables a run directory holds as Parquet, in load order; `runs` comes from run.json instead.
RUN_TABLES: dict[str, pa.Schema] = {
    "documents": DOCUMENTS,
    "summaries": SUMMARIES,
    "requests": REQUESTS,
    "token_gaps": TOKEN_GAPS,
    "decisions": DECISIONS,
    "engine_itl": ENGINE_ITL,
    "engine_ttft": ENGINE_TTFT,
    "engine_steps": ENGINE_STEPS,
}

# Columns every row must carry; any other column a producer leaves out is stored as null.
REQUIRED: dict[str, frozenset[str]] = {
    "documents": frozenset({"run_id", "doc_id", "status"}),
    "summaries": frozenset({"run_id", "doc_id", "summary"}),
    "requests": frozenset({"run_id", "request_id", "class", "stage", "replica", "t_submit"}),
    "token_gaps": frozenset({"run_id", "request_id", "idx", "gap_s", "t"}),
    "decisions": frozenset({"run_id", "t", "replica", "batch_seats", "chunk_tokens"}),
    "engine_itl": frozenset({"run_id", "replica", "t0", "t1", "le_low", "le", "count"}),
    "engine_ttft": frozenset({"run_id", "replica", "t0", "t1", "le_low", "le", "count"}),
    "engine_steps": frozenset({"run_id", "t", "replica", "steps"}),
}
