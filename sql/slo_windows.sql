-- Per run, SLO window and class: p50/p95/p99 of TTFT, ITL and E2E (ms), and whether chat held its
-- SLO in that window. Every window of the run appears for both classes, traffic or not.
-- slo_met (the same on both class rows of a window): chat ITL p99 <= SLO, chat TTFT p99 <= SLO,
-- chat E2E p99 <= SLO when one is set, and no chat request failed. A window without chat traffic
-- has nothing that broke the SLO, so it counts as met. The 1e-9 ms slack absorbs the float
-- rounding of seconds -> ms, so a p99 exactly at the SLO counts as met.
-- Chat ITL is the engine's (engine_windows) where the run recorded the replicas' ITL histogram, and
-- the streamed token gaps otherwise (itl_source says which; client_itl_p99_ms keeps the streamed
-- figure): on a busy host the client receives tokens in bursts, and its gaps carry the host's
-- scheduling noise beside the step times the engine and the Gate act on.
-- Chat TTFT is the run's own chat requests' where the window has some, and the plug-in's
-- chat-only TTFT histogram (engine_windows) otherwise (ttft_source says which): in production a
-- night holds no chat request of its own, and the engine's figure is the only one there is.
CREATE OR REPLACE VIEW slo_windows AS
WITH stats AS (
    SELECT
        w.*,
        w.itl_p99_ms AS client_itl_p99_ms,
        CASE WHEN w.class = 'chat' AND e.itl_p99_ms IS NOT NULL THEN 'engine' ELSE 'client' END
            AS itl_source,
        CASE WHEN itl_source = 'engine' THEN e.itl_p50_ms ELSE w.itl_p50_ms END AS chat_itl_p50,
        CASE WHEN itl_source = 'engine' THEN e.itl_p95_ms ELSE w.itl_p95_ms END AS chat_itl_p95,
        CASE WHEN itl_source = 'engine' THEN e.itl_p99_ms ELSE w.itl_p99_ms END AS chat_itl_p99,
        CASE
            WHEN w.class = 'chat' AND w.ttft_p99_ms IS NULL AND e.ttft_p99_ms IS NOT NULL
                THEN 'engine'
            ELSE 'client'
        END AS ttft_source,
        CASE WHEN ttft_source = 'engine' THEN e.ttft_p50_ms ELSE w.ttft_p50_ms END AS chat_ttft_p50,
        CASE WHEN ttft_source = 'engine' THEN e.ttft_p95_ms ELSE w.ttft_p95_ms END AS chat_ttft_p95,
        CASE WHEN ttft_source = 'engine' THEN e.ttft_p99_ms ELSE w.ttft_p99_ms END AS chat_ttft_p99
    FROM window_stats w
    LEFT JOIN engine_windows e USING (run_id, window_idx)
),
chat AS (
    SELECT
        w.run_id,
        w.window_idx,
        coalesce(w.chat_itl_p99 <= r.slo_itl_p99_ms + 1e-9, true)
            AND coalesce(w.chat_ttft_p99 <= r.slo_ttft_p99_ms + 1e-9, true)
            AND coalesce(w.e2e_p99_ms <= r.slo_e2e_p99_ms + 1e-9, true)
            AND w.failed = 0 AS slo_met
    FROM stats w
    JOIN runs r USING (run_id)
    WHERE w.class = 'chat'
)
SELECT
    w.run_id,
    w.window_idx,
    w.window_idx * c.window_s AS t_rel_s,
    c.origin + w.window_idx * c.window_s AS t_start,
    w.class,
    w.requests,
    w.failed,
    w.processed_tokens,
    w.token_gaps,
    w.chat_ttft_p50 AS ttft_p50_ms,
    w.chat_ttft_p95 AS ttft_p95_ms,
    w.chat_ttft_p99 AS ttft_p99_ms,
    w.ttft_source,
    w.chat_itl_p50 AS itl_p50_ms,
    w.chat_itl_p95 AS itl_p95_ms,
    w.chat_itl_p99 AS itl_p99_ms,
    w.client_itl_p99_ms,
    w.itl_source,
    w.e2e_p50_ms,
    w.e2e_p95_ms,
    w.e2e_p99_ms,
    coalesce(chat.slo_met, true) AS slo_met
FROM stats w
JOIN run_clock c USING (run_id)
LEFT JOIN chat USING (run_id, window_idx);
