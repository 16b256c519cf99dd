-- Per run, SLO window and class: p50/p95/p99 of TTFT, ITL and E2E (ms), and whether chat held its
-- SLO in that window. Every window of the run appears for both classes, traffic or not.
-- slo_met (the same on both class rows of a window): chat ITL p99 <= SLO, chat TTFT p99 <= SLO,
-- chat E2E p99 <= SLO when one is set, and no chat request failed. A window without chat traffic
-- has nothing that broke the SLO, so it counts as met. The 1e-9 ms slack absorbs the float
-- rounding of seconds -> ms, so a p99 exactly at the SLO counts as met.
CREATE OR REPLACE VIEW slo_windows AS
WITH chat AS (
    SELECT
        w.run_id,
        w.window_idx,
        coalesce(w.itl_p99_ms <= r.slo_itl_p99_ms + 1e-9, true)
            AND coalesce(w.ttft_p99_ms <= r.slo_ttft_p99_ms + 1e-9, true)
            AND coalesce(w.e2e_p99_ms <= r.slo_e2e_p99_ms + 1e-9, true)
            AND w.failed = 0 AS slo_met
    FROM window_stats w
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
    w.ttft_p50_ms,
    w.ttft_p95_ms,
    w.ttft_p99_ms,
    w.itl_p50_ms,
    w.itl_p95_ms,
    w.itl_p99_ms,
    w.e2e_p50_ms,
    w.e2e_p95_ms,
    w.e2e_p99_ms,
    coalesce(chat.slo_met, true) AS slo_met
FROM window_stats w
JOIN run_clock c USING (run_id)
LEFT JOIN chat USING (run_id, window_idx);
