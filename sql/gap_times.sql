-- Token gaps with their class and the SLO window in which the later token arrived: the rows
-- token-weighted ITL percentiles are computed over. Gaps of no known request (class NULL) are left
-- out, as no class can claim them.
CREATE OR REPLACE VIEW gap_times AS
SELECT
    g.run_id,
    g.class,
    g.gap_s,
    least(c.n_windows - 1, greatest(0, floor((g.t - c.origin) / c.window_s)))::BIGINT AS window_idx
FROM token_gaps g
JOIN run_clock c USING (run_id)
WHERE g.class IS NOT NULL;
