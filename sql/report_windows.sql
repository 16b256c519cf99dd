-- The report's time series: one row per SLO window of one run.
SELECT * FROM run_windows WHERE run_id = $run_id ORDER BY window_idx;
