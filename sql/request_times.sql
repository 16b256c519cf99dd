-- Requests with the SLO window each one counts in. TTFT belongs to the window in which the first
-- token arrived (that is when the user saw it); completion, failure and processed tokens belong to
-- the window in which the request ended. Times outside the run fall into its first or last window.
CREATE OR REPLACE VIEW request_times AS
SELECT
    q.*,
    least(c.n_windows - 1, greatest(0,
        floor((coalesce(q.t_first_token, q.t_end, q.t_submit) - c.origin) / c.window_s)
    ))::BIGINT AS first_window,
    least(c.n_windows - 1, greatest(0,
        floor((coalesce(q.t_end, q.t_submit) - c.origin) / c.window_s)
    ))::BIGINT AS end_window
FROM requests q
JOIN run_clock c USING (run_id);
