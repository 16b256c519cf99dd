-- Rebuild one run's rollups (window_stats, class_stats) from its rows; the loader runs this in the
-- same transaction as load_run.sql. Rollups are data: after changing this file, reload the runs
-- (`nightshift ingest`) to recompute them.
--
-- TTFT and E2E are request-weighted, ITL token-weighted (over every token gap, not an average of
-- per-request figures). TTFT and ITL count every request that streamed tokens, because its user saw
-- them; E2E counts only requests that finished ok, since a failure's end is not a completion.
-- Per window: TTFT belongs to the window of the first token, ITL to that of the later token of each
-- gap, and completions, failures and processed tokens to the window in which the request ended.

DELETE FROM window_stats WHERE run_id = $run_id;
INSERT INTO window_stats BY NAME
WITH grid AS (
    SELECT c.run_id, c.window_idx, k.class
    FROM (
        SELECT run_id, unnest(range(n_windows)) AS window_idx FROM run_clock WHERE run_id = $run_id
    ) c
    CROSS JOIN (VALUES ('chat'), ('batch')) k(class)
),
ttft AS (
    SELECT run_id, first_window AS window_idx, class, quantile_cont(ttft_s, [0.5, 0.95, 0.99]) AS q
    FROM request_times
    WHERE run_id = $run_id AND ttft_s IS NOT NULL
    GROUP BY ALL
),
ends AS (
    SELECT
        run_id,
        end_window AS window_idx,
        class,
        count(*) AS requests,
        count(*) FILTER (WHERE status <> 'ok') AS failed,
        sum(prompt_tokens + output_tokens) FILTER (WHERE status = 'ok') AS processed_tokens,
        quantile_cont(e2e_s, [0.5, 0.95, 0.99]) FILTER (WHERE status = 'ok') AS q
    FROM request_times
    WHERE run_id = $run_id
    GROUP BY ALL
),
itl AS (
    SELECT run_id, window_idx, class, count(*) AS token_gaps, quantile_cont(gap_s, [0.5, 0.95, 0.99]) AS q
    FROM gap_times
    WHERE run_id = $run_id
    GROUP BY ALL
)
SELECT
    g.run_id,
    g.window_idx,
    g.class,
    coalesce(e.requests, 0) AS requests,
    coalesce(e.failed, 0) AS failed,
    coalesce(e.processed_tokens, 0) AS processed_tokens,
    coalesce(i.token_gaps, 0) AS token_gaps,
    t.q[1] * 1000 AS ttft_p50_ms,
    t.q[2] * 1000 AS ttft_p95_ms,
    t.q[3] * 1000 AS ttft_p99_ms,
    i.q[1] * 1000 AS itl_p50_ms,
    i.q[2] * 1000 AS itl_p95_ms,
    i.q[3] * 1000 AS itl_p99_ms,
    e.q[1] * 1000 AS e2e_p50_ms,
    e.q[2] * 1000 AS e2e_p95_ms,
    e.q[3] * 1000 AS e2e_p99_ms
FROM grid g
LEFT JOIN ttft t USING (run_id, window_idx, class)
LEFT JOIN ends e USING (run_id, window_idx, class)
LEFT JOIN itl i USING (run_id, window_idx, class);

DELETE FROM class_stats WHERE run_id = $run_id;
INSERT INTO class_stats BY NAME
WITH req AS (
    SELECT
        run_id,
        class,
        count(*) AS requests,
        count(*) FILTER (WHERE status <> 'ok') AS failed,
        sum(output_tokens) AS output_tokens,
        quantile_cont(ttft_s, [0.5, 0.95, 0.99]) AS ttft,
        quantile_cont(e2e_s, [0.5, 0.95, 0.99]) FILTER (WHERE status = 'ok') AS e2e
    FROM requests
    WHERE run_id = $run_id
    GROUP BY run_id, class
),
itl AS (
    SELECT run_id, class, count(*) AS token_gaps, quantile_cont(gap_s, [0.5, 0.95, 0.99]) AS q
    FROM token_gaps
    WHERE run_id = $run_id AND class IS NOT NULL
    GROUP BY run_id, class
)
SELECT
    req.run_id,
    req.class,
    req.requests,
    req.failed,
    req.output_tokens,
    coalesce(itl.token_gaps, 0) AS token_gaps,
    req.ttft[1] * 1000 AS ttft_p50_ms,
    req.ttft[2] * 1000 AS ttft_p95_ms,
    req.ttft[3] * 1000 AS ttft_p99_ms,
    itl.q[1] * 1000 AS itl_p50_ms,
    itl.q[2] * 1000 AS itl_p95_ms,
    itl.q[3] * 1000 AS itl_p99_ms,
    req.e2e[1] * 1000 AS e2e_p50_ms,
    req.e2e[2] * 1000 AS e2e_p95_ms,
    req.e2e[3] * 1000 AS e2e_p99_ms
FROM req
LEFT JOIN itl USING (run_id, class);
