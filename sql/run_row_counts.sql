-- Rows one run holds in each table: a reload must leave these equal to the run's files.
SELECT
    (SELECT count(*) FROM runs WHERE run_id = $run_id) AS runs,
    (SELECT count(*) FROM documents WHERE run_id = $run_id) AS documents,
    (SELECT count(*) FROM summaries WHERE run_id = $run_id) AS summaries,
    (SELECT count(*) FROM requests WHERE run_id = $run_id) AS requests,
    (SELECT count(*) FROM token_gaps WHERE run_id = $run_id) AS token_gaps,
    (SELECT count(*) FROM decisions WHERE run_id = $run_id) AS decisions,
    (SELECT count(*) FROM engine_itl WHERE run_id = $run_id) AS engine_itl,
    (SELECT count(*) FROM engine_ttft WHERE run_id = $run_id) AS engine_ttft,
    (SELECT count(*) FROM engine_steps WHERE run_id = $run_id) AS engine_steps;
