-- The report's latency table: p50/p95/p99 of TTFT, ITL and E2E per class of one run.
SELECT * FROM class_latency WHERE run_id = $run_id ORDER BY class DESC;
