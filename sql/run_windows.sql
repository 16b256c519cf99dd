-- Per run and SLO window: what chat saw (p99s, failures, slo_met) beside the batch work done
-- (prompt + output tokens of batch requests that ended ok in the window, documents finished). The
-- report's time series and the goodput figures are read from here.
CREATE OR REPLACE VIEW run_windows AS
WITH docs AS (
    SELECT
        d.run_id,
        least(c.n_windows - 1, greatest(0, floor((d.t_done - c.origin) / c.window_s)))::BIGINT AS window_idx,
        count(*) AS documents_done
    FROM documents d
    JOIN run_clock c USING (run_id)
    WHERE d.status = 'done'
    GROUP BY ALL
)
SELECT
    s.run_id,
    s.window_idx,
    s.t_rel_s,
    s.t_start,
    -- the last window is cut short by the end of the run
    least(c.window_s, c.duration_s - s.t_rel_s) AS window_len_s,
    s.slo_met,
    s.requests AS chat_requests,
    s.failed AS chat_failed,
    s.itl_p99_ms AS chat_itl_p99_ms,
    s.ttft_p99_ms AS chat_ttft_p99_ms,
    s.e2e_p99_ms AS chat_e2e_p99_ms,
    b.requests - b.failed AS batch_requests,
    b.processed_tokens AS batch_tokens,
    b.processed_tokens / nullif(window_len_s, 0) AS batch_tokens_per_s,
    coalesce(d.documents_done, 0) AS documents_done
FROM slo_windows s
JOIN slo_windows b ON b.run_id = s.run_id AND b.window_idx = s.window_idx AND b.class = 'batch'
JOIN run_clock c ON c.run_id = s.run_id
LEFT JOIN docs d ON d.run_id = s.run_id AND d.window_idx = s.window_idx
WHERE s.class = 'chat';
