-- The report's headline: goodput of one run.
SELECT * FROM batch_goodput WHERE run_id = $run_id;
