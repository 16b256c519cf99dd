-- The headline per run: batch tokens (prompt + output of ok batch requests) per second and
-- documents per hour, raw and as goodput. Goodput counts only the work done in windows where chat
-- held its SLO, divided by the whole run's duration: work bought with an SLO breach is worth nothing.
CREATE OR REPLACE VIEW batch_goodput AS
SELECT
    w.run_id,
    c.duration_s,
    count(*) AS windows,
    count(*) FILTER (WHERE w.slo_met) AS windows_met,
    count(*) FILTER (WHERE w.slo_met) / count(*) AS slo_attainment,
    sum(w.batch_tokens) AS batch_tokens,
    coalesce(sum(w.batch_tokens) FILTER (WHERE w.slo_met), 0) AS good_batch_tokens,
    sum(w.documents_done) AS documents_done,
    coalesce(sum(w.documents_done) FILTER (WHERE w.slo_met), 0) AS good_documents,
    sum(w.batch_tokens) / nullif(c.duration_s, 0) AS batch_tokens_per_s,
    good_batch_tokens / nullif(c.duration_s, 0) AS slo_batch_tokens_per_s,
    sum(w.documents_done) * 3600 / nullif(c.duration_s, 0) AS documents_per_hour,
    good_documents * 3600 / nullif(c.duration_s, 0) AS goodput_documents_per_hour
FROM run_windows w
JOIN run_clock c USING (run_id)
GROUP BY w.run_id, c.duration_s;
