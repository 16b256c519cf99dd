-- Warehouse tables: one row per run in `runs`, each run's Parquet tables, and two rollups that the
-- loader computes per run (rollup_run.sql). Every row is tagged with run_id so that reloading a run
-- replaces exactly its rows.

CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    engine_config VARCHAR,
    policy VARCHAR,
    hardware_count BIGINT,
    replicas BIGINT,            -- NULL: count the distinct replicas in requests
    hourly_usd DOUBLE,          -- price of one replica-hour
    slo_itl_p99_ms DOUBLE,
    slo_ttft_p99_ms DOUBLE,
    slo_e2e_p99_ms DOUBLE,
    window_s DOUBLE,
    started DOUBLE,             -- epoch seconds
    ended DOUBLE,
    corpus_path VARCHAR,
    corpus_fingerprint VARCHAR,
    loaded_at TIMESTAMP
);

CREATE TABLE IF NOT EXISTS documents (
    run_id VARCHAR NOT NULL,
    doc_id VARCHAR NOT NULL,
    status VARCHAR NOT NULL,    -- 'done' | 'failed' | 'skipped'
    reason VARCHAR,
    prompt_tokens BIGINT,
    sections BIGINT,
    summary_tokens BIGINT,
    t_done DOUBLE
);

CREATE TABLE IF NOT EXISTS summaries (
    run_id VARCHAR NOT NULL,
    doc_id VARCHAR NOT NULL,
    summary VARCHAR NOT NULL,
    summary_tokens BIGINT,
    sections BIGINT,
    replicas VARCHAR[]
);

CREATE TABLE IF NOT EXISTS requests (
    run_id VARCHAR NOT NULL,
    request_id VARCHAR NOT NULL,
    class VARCHAR NOT NULL,     -- 'chat' | 'batch'
    stage VARCHAR NOT NULL,     -- 'chat' | 'map' | 'reduce' | 'whole'
    replica VARCHAR NOT NULL,
    doc_id VARCHAR,
    prompt_tokens BIGINT,
    cached_tokens BIGINT,
    output_tokens BIGINT,
    t_submit DOUBLE NOT NULL,
    t_first_token DOUBLE,
    t_end DOUBLE,
    ttft_s DOUBLE,
    e2e_s DOUBLE,
    itl_p50_s DOUBLE,
    itl_p99_s DOUBLE,
    itl_max_s DOUBLE,
    status VARCHAR,             -- 'ok' | 'error' | 'timeout' | 'cancelled'
    error VARCHAR
);

CREATE TABLE IF NOT EXISTS token_gaps (
    run_id VARCHAR NOT NULL,
    request_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    gap_s DOUBLE NOT NULL,
    t DOUBLE NOT NULL,          -- arrival of the later token, epoch seconds
    class VARCHAR               -- the request's class, filled in on load (NULL: no such request)
);

-- The replicas' own ITL histogram, as scraped through the run: between scrapes t0 and t1, `count`
-- token gaps of any sequence fell in the bucket (le_low, le] seconds (le = +inf for the last). Runs
-- that recorded it judge chat ITL by it (engine_windows); the others by the streamed token_gaps.
CREATE TABLE IF NOT EXISTS engine_itl (
    run_id VARCHAR NOT NULL,
    replica VARCHAR NOT NULL,
    t0 DOUBLE NOT NULL,
    t1 DOUBLE NOT NULL,
    le_low DOUBLE NOT NULL,
    le DOUBLE NOT NULL,
    count BIGINT NOT NULL
);

-- The plug-in's chat-only TTFT histogram, in engine_itl's shape: `count` chat requests got their
-- first token within (le_low, le] seconds of arriving, between scrapes t0 and t1. A run's windows
-- judge chat TTFT by it where the run holds no chat request of its own (slo_windows).
CREATE TABLE IF NOT EXISTS engine_ttft (
    run_id VARCHAR NOT NULL,
    replica VARCHAR NOT NULL,
    t0 DOUBLE NOT NULL,
    t1 DOUBLE NOT NULL,
    le_low DOUBLE NOT NULL,
    le DOUBLE NOT NULL,
    count BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS decisions (
    run_id VARCHAR NOT NULL,
    t DOUBLE NOT NULL,
    replica VARCHAR NOT NULL,
    batch_seats BIGINT NOT NULL,
    chunk_tokens BIGINT NOT NULL,
    pause BOOLEAN,
    observed_itl_p99_s DOUBLE,
    observed_ttft_p99_s DOUBLE,
    observed_kv_usage DOUBLE,
    predicted_step_ms DOUBLE,
    reason VARCHAR,
    prefill_budget_tokens BIGINT
);
-- Warehouses made before decisions carried these gain the columns (null for old runs).
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS prefill_budget_tokens BIGINT;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS batch_step_target_ms DOUBLE;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS kv_room_tokens BIGINT;
-- Share of the window's engine steps that ran at the batch step target (the target held a batch
-- prefill back): growth is judged only by windows in which the target bound.
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS observed_target_bound_share DOUBLE;
-- Chat's prefix-cache working set the KV guard kept room for (scheduler/chat_cache.py).
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS observed_chat_cache_tokens BIGINT;
-- The chat pressure the controller grows to, from how much its windows at one target varied
-- (scheduler/pressure_spread.py).
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS slack_mark DOUBLE;
-- The mean step time batch keeps to beside chat under an E2E SLO (null: each step held to the
-- target; scheduler/step_budget.py, StepCredit).
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS mean_step_target_ms DOUBLE;

-- The engine plug-in's status between two reads (serving/plugin_sensor.py): engine steps, their
-- mean measured time and its ratio to the latency model's prediction, batch prefill tokens per
-- step that carried batch, and chat's own ITL p99 (chat gaps only) over that span.
CREATE TABLE IF NOT EXISTS engine_steps (
    run_id VARCHAR NOT NULL,
    t DOUBLE NOT NULL,
    replica VARCHAR NOT NULL,
    state VARCHAR,                  -- inert, active, paused, expired or lost
    control_seq BIGINT,
    batch_step_target_ms DOUBLE,
    steps BIGINT NOT NULL,
    mean_step_ms DOUBLE,
    step_time_ratio DOUBLE,
    batch_prefill_tokens BIGINT,
    batch_tokens_per_step DOUBLE,
    chat_itl_p99_s DOUBLE
);
-- Steps in which the target held a batch prefill back (ran at the target); null for old runs.
ALTER TABLE engine_steps ADD COLUMN IF NOT EXISTS target_bound_steps BIGINT;
-- Chat's prefix-cache working set the plug-in counted when it wrote the status; null for old runs.
ALTER TABLE engine_steps ADD COLUMN IF NOT EXISTS chat_cache_tokens BIGINT;

-- Rollups: latency percentiles per SLO window and per class, computed once per load so that the
-- views answer in milliseconds however many nights the warehouse holds. Percentiles in ms.
CREATE TABLE IF NOT EXISTS window_stats (
    run_id VARCHAR NOT NULL,
    window_idx BIGINT NOT NULL,
    class VARCHAR NOT NULL,
    requests BIGINT,            -- requests that ended in the window
    failed BIGINT,              -- of those, not 'ok'
    processed_tokens BIGINT,    -- prompt + output tokens of the window's ok requests
    token_gaps BIGINT,
    ttft_p50_ms DOUBLE,
    ttft_p95_ms DOUBLE,
    ttft_p99_ms DOUBLE,
    itl_p50_ms DOUBLE,
    itl_p95_ms DOUBLE,
    itl_p99_ms DOUBLE,
    e2e_p50_ms DOUBLE,
    e2e_p95_ms DOUBLE,
    e2e_p99_ms DOUBLE
);

CREATE TABLE IF NOT EXISTS class_stats (
    run_id VARCHAR NOT NULL,
    class VARCHAR NOT NULL,
    requests BIGINT,
    failed BIGINT,
    output_tokens BIGINT,
    token_gaps BIGINT,
    ttft_p50_ms DOUBLE,
    ttft_p95_ms DOUBLE,
    ttft_p99_ms DOUBLE,
    itl_p50_ms DOUBLE,
    itl_p95_ms DOUBLE,
    itl_p99_ms DOUBLE,
    e2e_p50_ms DOUBLE,
    e2e_p95_ms DOUBLE,
    e2e_p99_ms DOUBLE
);
