-- Rows among a run's incoming files that belong to another run (or to none): must all be 0.
SELECT
    (SELECT count(*) FROM incoming_documents WHERE run_id IS DISTINCT FROM $run_id) AS documents,
    (SELECT count(*) FROM incoming_summaries WHERE run_id IS DISTINCT FROM $run_id) AS summaries,
    (SELECT count(*) FROM incoming_requests WHERE run_id IS DISTINCT FROM $run_id) AS requests,
    (SELECT count(*) FROM incoming_token_gaps WHERE run_id IS DISTINCT FROM $run_id) AS token_gaps,
    (SELECT count(*) FROM incoming_decisions WHERE run_id IS DISTINCT FROM $run_id) AS decisions,
    (SELECT count(*) FROM incoming_engine_itl WHERE run_id IS DISTINCT FROM $run_id) AS engine_itl,
    (SELECT count(*) FROM incoming_engine_ttft WHERE run_id IS DISTINCT FROM $run_id) AS engine_ttft,
    (SELECT count(*) FROM incoming_engine_steps WHERE run_id IS DISTINCT FROM $run_id) AS engine_steps;
