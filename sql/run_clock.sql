-- One row per run: where its SLO windows start, how long they are, how long the run lasted.
-- The origin is run.json's `started` (else the first submit); the end is `ended` (else the last
-- token). Every time-based view counts windows from here, so they all agree on window numbers.
CREATE OR REPLACE VIEW run_clock AS
WITH spans AS (
    SELECT
        run_id,
        min(t_submit) AS t_min,
        max(coalesce(t_end, t_first_token, t_submit)) AS t_max
    FROM requests
    GROUP BY run_id
)
SELECT
    r.run_id,
    coalesce(r.started, s.t_min, 0.0) AS origin,
    r.window_s,
    greatest(coalesce(r.ended, s.t_max, origin) - origin, 0.0) AS duration_s,
    greatest(1, ceil(duration_s / r.window_s))::BIGINT AS n_windows
FROM runs r
LEFT JOIN spans s USING (run_id);
