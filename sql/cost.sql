-- What a run cost and what it bought: replicas x hourly_usd x duration, per 1M batch tokens
-- (prompt + output of ok batch requests) and per finished document. The replicas also served chat;
-- the whole bill is charged to batch, so these are upper bounds on the batch price.
CREATE OR REPLACE VIEW cost AS
WITH used AS (
    SELECT
        run_id,
        count(DISTINCT replica) AS replicas_seen,
        coalesce(sum(prompt_tokens + output_tokens) FILTER (WHERE class = 'batch' AND status = 'ok'), 0)
            AS batch_tokens
    FROM requests
    GROUP BY run_id
),
docs AS (
    SELECT run_id, count(*) AS documents_done FROM documents WHERE status = 'done' GROUP BY run_id
),
billed AS (
    -- run.json's replica count wins; without one, every replica that served a request is billed
    SELECT
        r.run_id,
        r.hourly_usd,
        r.hardware_count,
        coalesce(r.replicas, u.replicas_seen, 0) AS replicas_billed,
        c.duration_s,
        coalesce(u.batch_tokens, 0) AS batch_tokens,
        coalesce(d.documents_done, 0) AS documents_done
    FROM runs r
    JOIN run_clock c USING (run_id)
    LEFT JOIN used u USING (run_id)
    LEFT JOIN docs d USING (run_id)
)
SELECT
    run_id,
    hourly_usd,
    replicas_billed AS replicas,
    replicas_billed * hardware_count AS devices,
    duration_s,
    hourly_usd * replicas_billed * duration_s / 3600 AS cost_usd,
    batch_tokens,
    documents_done,
    cost_usd * 1e6 / nullif(batch_tokens, 0) AS usd_per_1m_batch_tokens,
    cost_usd / nullif(documents_done, 0) AS usd_per_document
FROM billed;
