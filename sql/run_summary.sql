-- One row per run: what it was (config, policy, corpus, SLO) and how much it did.
CREATE OR REPLACE VIEW run_summary AS
WITH docs AS (
    SELECT
        run_id,
        count(*) AS documents,
        count(*) FILTER (WHERE status = 'done') AS documents_done,
        count(*) FILTER (WHERE status = 'failed') AS documents_failed,
        count(*) FILTER (WHERE status = 'skipped') AS documents_skipped
    FROM documents
    GROUP BY run_id
),
req AS (
    SELECT
        run_id,
        count(*) FILTER (WHERE class = 'chat') AS chat_requests,
        count(*) FILTER (WHERE class = 'batch') AS batch_requests,
        count(*) FILTER (WHERE status <> 'ok') AS failed_requests,
        coalesce(sum(prompt_tokens + output_tokens) FILTER (WHERE class = 'batch' AND status = 'ok'), 0)
            AS batch_tokens,
        coalesce(sum(cached_tokens) FILTER (WHERE class = 'batch'), 0) AS batch_cached_tokens,
        count(DISTINCT replica) AS replicas_seen
    FROM requests
    GROUP BY run_id
),
dec AS (
    SELECT run_id, count(*) AS decisions FROM decisions GROUP BY run_id
)
SELECT
    r.run_id,
    r.engine_config,
    r.policy,
    to_timestamp(r.started) AS started_at,
    to_timestamp(r.ended) AS ended_at,
    c.duration_s,
    c.n_windows AS windows,
    r.window_s,
    r.slo_itl_p99_ms,
    r.slo_ttft_p99_ms,
    r.slo_e2e_p99_ms,
    coalesce(d.documents, 0) AS documents,
    coalesce(d.documents_done, 0) AS documents_done,
    coalesce(d.documents_failed, 0) AS documents_failed,
    coalesce(d.documents_skipped, 0) AS documents_skipped,
    coalesce(q.chat_requests, 0) AS chat_requests,
    coalesce(q.batch_requests, 0) AS batch_requests,
    coalesce(q.failed_requests, 0) AS failed_requests,
    coalesce(q.batch_tokens, 0) AS batch_tokens,
    coalesce(q.batch_cached_tokens, 0) AS batch_cached_tokens,
    coalesce(r.replicas, q.replicas_seen, 0) AS replicas,
    coalesce(x.decisions, 0) AS decisions,
    r.corpus_path,
    r.corpus_fingerprint,
    r.loaded_at
FROM runs r
JOIN run_clock c USING (run_id)
LEFT JOIN docs d USING (run_id)
LEFT JOIN req q USING (run_id)
LEFT JOIN dec x USING (run_id);
