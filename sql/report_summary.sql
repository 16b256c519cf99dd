-- The report's header facts for one run.
SELECT * FROM run_summary WHERE run_id = $run_id;
