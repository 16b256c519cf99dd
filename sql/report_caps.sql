-- The controller's caps over time for one run, seconds from the run's origin, per replica.
SELECT
    d.replica,
    d.t - c.origin AS t_rel_s,
    d.batch_seats,
    d.batch_step_target_ms,
    coalesce(d.pause, false) AS pause,
    d.reason
FROM decisions d
JOIN run_clock c USING (run_id)
WHERE d.run_id = $run_id
ORDER BY d.replica, d.t;
