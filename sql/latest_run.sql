-- The run a report shows by default: the one that started last (loaded last breaks ties).
SELECT run_id
FROM runs
ORDER BY started DESC NULLS LAST, loaded_at DESC
LIMIT 1;
