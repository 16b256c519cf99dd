-- Per run and SLO window: ITL p50/p95/p99 (ms) from the replicas' own ITL histogram (engine_itl),
-- and chat TTFT p50/p95/p99 (ms) from the plug-in's chat-only TTFT histogram (engine_ttft), each
-- summed over replicas, for the runs that recorded them. Each scrape interval belongs to the
-- window of its end, as a token gap does to that of its later token. Quantiles interpolate
-- linearly inside a bucket, as PromQL's histogram_quantile does; one in the +Inf bucket is the
-- highest finite bound. The ITL histogram is the plug-in's chat-only one where the plug-in runs,
-- else vLLM's, which counts every decoding sequence, chat and batch: they all wait the same steps.
CREATE OR REPLACE VIEW engine_windows AS
WITH observations AS (
    SELECT 'itl' AS metric, * FROM engine_itl
    UNION ALL BY NAME
    SELECT 'ttft' AS metric, * FROM engine_ttft
),
buckets AS (
    SELECT
        e.metric,
        e.run_id,
        least(c.n_windows - 1, greatest(0, floor((e.t1 - c.origin) / c.window_s)))::BIGINT AS window_idx,
        e.le_low,
        e.le,
        sum(e.count) AS n
    FROM observations e
    JOIN run_clock c USING (run_id)
    WHERE e.t1 > c.origin AND e.t0 < c.origin + c.duration_s
    GROUP BY ALL
),
ranked AS (
    SELECT
        *,
        sum(n) OVER w AS cum,
        sum(n) OVER (PARTITION BY metric, run_id, window_idx) AS total
    FROM buckets
    WINDOW w AS (PARTITION BY metric, run_id, window_idx ORDER BY le ROWS UNBOUNDED PRECEDING)
),
answers AS (
    SELECT
        r.metric,
        r.run_id,
        r.window_idx,
        q.q,
        arg_min(
            CASE
                WHEN isinf(r.le) THEN r.le_low
                ELSE r.le_low + (r.le - r.le_low) * (q.q * r.total - (r.cum - r.n)) / r.n
            END,
            r.le
        ) AS v,
        any_value(r.total) AS total
    FROM ranked r
    CROSS JOIN (VALUES (0.5), (0.95), (0.99)) q(q)
    WHERE r.cum >= q.q * r.total AND r.n > 0
    GROUP BY ALL
)
SELECT
    run_id,
    window_idx,
    any_value(total) FILTER (WHERE metric = 'itl')::BIGINT AS itl_observations,
    1000 * any_value(v) FILTER (WHERE metric = 'itl' AND q = 0.5) AS itl_p50_ms,
    1000 * any_value(v) FILTER (WHERE metric = 'itl' AND q = 0.95) AS itl_p95_ms,
    1000 * any_value(v) FILTER (WHERE metric = 'itl' AND q = 0.99) AS itl_p99_ms,
    any_value(total) FILTER (WHERE metric = 'ttft')::BIGINT AS ttft_observations,
    1000 * any_value(v) FILTER (WHERE metric = 'ttft' AND q = 0.5) AS ttft_p50_ms,
    1000 * any_value(v) FILTER (WHERE metric = 'ttft' AND q = 0.95) AS ttft_p95_ms,
    1000 * any_value(v) FILTER (WHERE metric = 'ttft' AND q = 0.99) AS ttft_p99_ms
FROM answers
GROUP BY run_id, window_idx;
