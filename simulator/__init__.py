"""A discrete-event vLLM-like replica in virtual time, driving the same controller as production.

Read in this order: `config` (settings), `entities` (requests and the content their tokens stand
for), `block_hashes` and `kv_cache` (paged KV with prefix caching), `engine_scheduler` (continuous
batching, chunked prefill, priorities, preemption), `replica` (one engine stepping in virtual time,
priced by a `scheduler` step-time model), `trace` (the trace CSV reader, which the real chat load
shares), `workloads` and `dispatcher` (chat sessions, trace replay, the batch backlog under the
policy's caps), `sensors` (what the policy observes), `events`, `loop`
and `simulation` (the heap loop and the run's state), `recorder` and `summary` (docs/design.md §4.5 records and
OUT.json), `run` (one call: `simulate(config, model, policy_factory)`).
"""
