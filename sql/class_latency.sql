-- Latency per run and class over the whole run: p50/p95/p99 of TTFT, ITL and E2E in ms, read from
-- the class_stats rollup (see rollup_run.sql for what each percentile counts).
CREATE OR REPLACE VIEW class_latency AS
SELECT * FROM class_stats;
