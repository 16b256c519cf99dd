-- Runs over the same corpus (same fingerprint) as one run, that run included: how each admission
-- policy fared on identical work. Goodput is only comparable between runs of the same corpus.
SELECT
    r.run_id,
    r.policy,
    r.engine_config,
    g.slo_batch_tokens_per_s,
    g.batch_tokens_per_s,
    g.goodput_documents_per_hour,
    g.slo_attainment,
    l.itl_p99_ms AS chat_itl_p99_ms,
    l.ttft_p99_ms AS chat_ttft_p99_ms,
    c.usd_per_1m_batch_tokens
FROM runs r
JOIN runs me ON me.run_id = $run_id
JOIN batch_goodput g ON g.run_id = r.run_id
JOIN cost c ON c.run_id = r.run_id
LEFT JOIN class_latency l ON l.run_id = r.run_id AND l.class = 'chat'
WHERE r.run_id = me.run_id
   OR (me.corpus_fingerprint <> '' AND r.corpus_fingerprint = me.corpus_fingerprint)
ORDER BY g.slo_batch_tokens_per_s DESC NULLS LAST, r.run_id;
