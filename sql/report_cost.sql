-- The report's cost figures for one run.
SELECT * FROM cost WHERE run_id = $run_id;
