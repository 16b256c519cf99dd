-- Replace every row of one run with the incoming_* relations the loader registered, so loading a
-- run twice leaves one copy. The loader wraps this in one transaction.

DELETE FROM runs WHERE run_id = $run_id;
INSERT INTO runs BY NAME SELECT *, current_localtimestamp() AS loaded_at FROM incoming_runs;

DELETE FROM documents WHERE run_id = $run_id;
INSERT INTO documents BY NAME SELECT * FROM incoming_documents;

DELETE FROM summaries WHERE run_id = $run_id;
INSERT INTO summaries BY NAME SELECT * FROM incoming_summaries;

DELETE FROM requests WHERE run_id = $run_id;
INSERT INTO requests BY NAME SELECT * FROM incoming_requests;

-- Each gap carries its request's class, looked up once here rather than joined by every rollup.
-- One class per request id, so a request recorded twice never doubles its gaps.
DELETE FROM token_gaps WHERE run_id = $run_id;
INSERT INTO token_gaps BY NAME
SELECT g.*, q.class
FROM incoming_token_gaps g
LEFT JOIN (
    SELECT request_id, any_value(class) AS class FROM requests WHERE run_id = $run_id GROUP BY request_id
) q USING (request_id);

DELETE FROM engine_itl WHERE run_id = $run_id;
INSERT INTO engine_itl BY NAME SELECT * FROM incoming_engine_itl;

DELETE FROM engine_ttft WHERE run_id = $run_id;
INSERT INTO engine_ttft BY NAME SELECT * FROM incoming_engine_ttft;

DELETE FROM engine_steps WHERE run_id = $run_id;
INSERT INTO engine_steps BY NAME SELECT * FROM incoming_engine_steps;

DELETE FROM decisions WHERE run_id = $run_id;
INSERT INTO decisions BY NAME SELECT * FROM incoming_decisions;
