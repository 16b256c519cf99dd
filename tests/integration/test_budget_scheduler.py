"""vLLM's real v1 scheduler with the plug-in, no model behind it (`tests/engine_harness.py`).

One engine-environment process runs every case (importing vLLM costs seconds); each test judges
one case's per-step token grants. The batch prompt is 16k tokens, the engine's step budget 512.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from scheduler.step_budget import BatchPrefill, BatchStepTarget
from serving.paths import REPO_ROOT, engine_python
from simulator.config import EngineParams
from simulator.engine_scheduler import EngineScheduler
from simulator.entities import BATCH_PRIORITY, CHAT_PRIORITY, Request, Segment
from simulator.kv_cache import KVCache
from tests.budget_fixtures import (
    ALONE_STEPS,
    BATCH_PROMPT,
    BLOCK,
    CHAT_PROMPT,
    MEAN_MS,
    MODEL,
    STEP_TOKENS,
    TARGET_MS,
)

CASES = [
    "canary",
    "stock_vs_inert",
    "target",
    "async",
    "change",
    "expiry",
    "malformed",
    "garbage_first",
    "step_log",
    "idle",
    "mean",
    "hold",
    "no_engine",
    "eviction",
    "chat_cache",
    "kv_stall",
    "stale_scale",
]


@pytest.fixture(scope="module")
def seen() -> dict:
    proc = subprocess.run(
        [str(engine_python()), "-m", "tests.engine_harness", *CASES],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_stock_vllm_starves_a_chat_that_arrives_mid_prefill_and_no_document_is_stock(seen):
    stock, inert = seen["stock_vs_inert"]["stock"], seen["stock_vs_inert"]["inert"]
    assert all("chat" not in s for s in stock), "stock vLLM runs the running batch prefill first"
    assert inert == stock


def test_batch_is_capped_per_step_and_a_new_chat_gets_its_whole_prompt(seen):
    steps = seen["target"]["steps"]
    assert all(0 < s["batch"] < 512 for s in steps[:3])
    assert steps[3]["chat"] == 300, "the chat prompt arriving mid-prefill gets all of it at once"
    assert "batch" not in steps[3], "and its step to itself: batch delays its first token once"
    assert all(s.get("chat") == 1 for s in steps[4:]), "then it decodes every step"
    grants = [s["batch"] for s in steps[4:]]
    assert all(g % 16 == 0 for g in grants)
    assert grants[-1] <= grants[0], "deeper into the prompt, the same target buys no more"


def test_batch_moves_again_beside_a_chat_prompt_that_finds_no_kv(seen):
    """Left no room beside a chat prompt the KV cannot take, the half-prefilled batch request
    would hold its blocks and the chat its turn for good; after one step that started no chat,
    batch moves, finishes, frees its blocks and the chat starts."""
    steps = seen["kv_stall"]["steps"]
    assert 0 < steps[0]["batch"] < 400
    assert steps[1] == {}, "the step reserved for the chat prompt: no batch, and no KV for chat"
    assert steps[2]["batch"] > 0, "then batch moves"
    assert steps[-1].get("chat") == 300, steps


def test_a_scale_a_passing_spell_set_high_holds_batch_only_until_its_evidence_expires(seen):
    """The scale learns only from batch steps, so one that forbids every chunk would never learn
    it is too high: its evidence expires, and the step it then allows sets it afresh."""
    case = seen["stale_scale"]
    assert case["latched"] == [{}, {}], "at 3x the model, no block fits the target"
    assert case["unscaled"].get("batch", 0) > 0, "sized to the model as a controller sends it"
    status = case["unscaled_status"]
    assert status["model_scale"] == 1.0 and status["totals"]["batch_model_s"] > 0
    assert all(s.get("batch", 0) > 0 for s in case["freed"]), case["freed"]
    assert case["scale"] == 1.0, "learnt from the step it allowed (microseconds here)"


def test_the_gpu_variant_on_vllms_async_scheduler_grants_what_the_sync_one_does(seen):
    stock, target = seen["async"]["stock"], seen["async"]["target"]
    assert all("chat" not in s for s in stock), "stock async vLLM starves the chat just the same"
    assert target == seen["target"]["steps"]


def test_a_new_document_applies_on_the_next_step_and_pause_stops_batch_prefill(seen):
    c = seen["change"]
    assert 0 < c["first"] < c["second"] <= 512
    assert c["paused"] == 0
    # Steps the target held back are counted (the first, the second if under the step's 512
    # tokens); a paused step holds nothing back, it sizes nothing.
    totals = c["status"]["totals"]
    assert totals["steps"] == 3
    assert totals["target_bound_steps"] == 1 + (c["second"] < 512)


def test_expiry_pauses_batch_prefill_while_decodes_and_chat_go_on(seen):
    e = seen["expiry"]
    assert e["before"]["batch"] > 0
    for s in e["after"]:
        assert "batch" not in s
        assert s["decoding"] == 1
    assert e["after"][0]["chat"] == 64
    assert e["status"]["state"] == "expired"


def test_a_malformed_document_is_rejected_and_the_previous_one_kept(seen):
    m = seen["malformed"]
    assert m["after"][0]["chat"] == 300
    assert [s["batch"] for s in m["after"][1:]] == [m["valid"]] * 2
    assert m["status"]["rejected"] == 1 and "not JSON" in m["status"]["last_rejection"]
    assert m["status"]["state"] == "active"


def test_garbage_before_any_valid_document_leaves_the_engine_stock(seen):
    g = seen["garbage_first"]
    assert [s["batch"] for s in g["steps"]] == [512, 512]
    assert g["status"]["state"] == "inert" and g["status"]["rejected"] == 1


def test_with_no_chat_in_the_engine_batch_runs_to_the_idle_target_until_chat_arrives(seen):
    alone, beside = seen["idle"]["alone"], seen["idle"]["beside"]
    assert all(s.get("batch", 0) > 0 for s in alone), "the idle target buys chunks"
    assert beside[0]["chat"] == 300, "the arriving chat gets its whole prompt next step"
    assert all(s.get("batch", 0) == 0 for s in beside), "with chat in, the 1 ms target holds"


def test_a_paused_batch_prompt_alone_holds_the_step_until_input_or_a_new_document(seen):
    h = seen["hold"]
    assert h["held"] == {} and h["chat_woke"] == "input", "engine input ends the hold"
    assert h["beside_chat"][0]["chat"] == 64 and h["beside_chat_holds"] is None
    assert all("batch" not in s for s in h["beside_chat"]), "the pause still holds batch"
    assert h["held_again"] == {} and h["document_woke"] == "control"
    assert h["resumed"]["batch"] > 0, "the resuming document applies on the next step"


def test_a_renewed_pause_does_not_end_the_hold_and_the_status_goes_on_meanwhile(seen):
    h = seen["hold"]
    assert h["quiet_ended"] == "due", "nothing could change the step: the bound ends the hold"
    assert h["quiet_hold_s"] >= 1.5
    assert h["status_during_hold"] == {"written": True, "seq": 4, "state": "paused"}
    assert h["quiet_measured_s"] < h["quiet_hold_s"] / 2, "the wait is not step time"


def test_a_scheduler_stepped_by_hand_is_never_held(seen):
    n = seen["no_engine"]
    assert n["steps"] == [{}, {}, {}] and n["held"] is None and n["engine"] is None


def test_the_step_log_holds_every_step_as_scheduled_in_the_samples_format(seen, tmp_path):
    from serving.step_samples import read_samples

    ran, log = seen["step_log"]["steps"], seen["step_log"]["log"]
    assert len(log) == len(ran)
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in log))
    for scheduled, sample in zip(ran, read_samples(path), strict=True):
        batch = sample.batch
        assert sum(c.tokens for c in batch.prefills) + batch.decode_seqs == sum(scheduled.values())
        assert sample.seconds > 0
    samples = read_samples(path)
    second = samples[1].batch.prefills
    assert [(c.tokens, c.prefix_tokens) for c in second] == [(ran[1]["batch"], ran[0]["batch"])]
    assert [c.tokens for c in samples[3].batch.prefills] == [ran[3]["chat"]]


def test_a_finished_documents_blocks_are_reused_before_a_chat_prefix(seen):
    """Stock vLLM evicts the chat prompt's cached blocks (freed first) before a finished
    document's; with a controller in charge the document's go first and chat's prefix survives."""
    hits = seen["eviction"]
    assert hits["stock"] == 0
    assert hits["plugin"] == 256 - 16, "every full block of the chat prompt but the last"


def test_the_status_counts_the_blocks_chat_left_cached_until_chat_holds_them_again(seen):
    """The KV guard's view of chat's prefix-cache working set (scheduler/chat_cache.py)."""
    cache = seen["chat_cache"]
    assert cache["no horizon"] is None, "counted only over a horizon the controller names"
    assert cache["chat left"] == 256, "the finished chat's 16 full blocks"
    assert cache["held again"] == 16, "all but the last block, which vLLM computes again"
    # The prompt sent again left its blocks, with its own copy of the block vLLM computed again
    # (vLLM keeps both); the document that ran after it added none of its own.
    assert cache["after a document"] == 256 + 16
    assert cache["horizon 0"] == 0


def test_canary_the_vllm_internals_the_plugin_relies_on_are_unchanged(seen):
    """Fails naming each vLLM name, signature or call site that moved (vLLM changes fast)."""
    canary = seen["canary"]
    assert canary["problems"] == [], f"vLLM {canary['vllm']}: " + "; ".join(canary["problems"])


def simulated(
    batch_prompt: int,
    chat_at: int,
    steps: int,
    kv_blocks: int = 12_500,
    max_tokens: int = 8,
    mean_ms: float | None = None,
    chat_tokens: int = 8,
) -> list[dict[str, int]]:
    """A harness case on the simulator's engine: what it would schedule, step by step (an empty
    step where it would go idle)."""
    params = EngineParams(
        kv_capacity_tokens=kv_blocks * BLOCK,
        block_size=BLOCK,
        max_num_batched_tokens=STEP_TOKENS,
        long_prefill_token_threshold=STEP_TOKENS,
        max_num_seqs=16,
        enable_prefix_caching=False,
    )
    eng = EngineScheduler(params, KVCache(kv_blocks * BLOCK, BLOCK, False))
    mean_s = None if mean_ms is None else mean_ms / 1000
    eng.batch_target = BatchStepTarget(TARGET_MS / 1000, MODEL, mean_target_s=mean_s)

    def req(rid, prompt, cls, priority, out=8):
        segments = (Segment((rid,), prompt),)
        return Request(rid, cls, "chat", priority, 0.0, segments, out, (rid, "out"))

    eng.add(req("batch", batch_prompt, "batch", BATCH_PRIORITY, max_tokens))
    seen = []
    for i in range(steps):
        if i == chat_at:
            eng.add(req("chat", CHAT_PROMPT, "chat", CHAT_PRIORITY, chat_tokens))
        s = eng.schedule(float(i))
        if s is None:
            seen.append({})
            continue
        seen.append({r.request_id: n for r, n in s.prefills} | {r.request_id: 1 for r in s.decodes})
        eng.complete(s, float(i))
    return seen


def test_the_simulators_engine_grants_what_the_plugin_grants_step_by_step(seen):
    assert simulated(BATCH_PROMPT, chat_at=3, steps=9) == seen["target"]["steps"]


def test_under_a_mean_target_a_deep_prompt_moves_beside_chat_and_the_simulator_agrees(seen):
    """Beside one chat decode a block deep in the prompt does not fit the mean: the plug-in grants
    it in every other step or so, on what the steps between left, never past the target; the
    simulator's engine schedules the same tokens step by step."""
    from scheduler.step import PrefillChunk, StepBatch
    from scheduler.step_budget import size_batch_prefills

    steps = seen["mean"]["steps"]
    beside = [s.get("batch", 0) for s in steps[ALONE_STEPS + 1 :] if "chat" in s]
    prefix = sum(s.get("batch", 0) for s in steps[: ALONE_STEPS + 1])
    decode = StepBatch((), 1, CHAT_PROMPT)
    alone = size_batch_prefills(MODEL, MEAN_MS / 1000, STEP_TOKENS, decode,
                                [BatchPrefill(prefix, BATCH_PROMPT - prefix)], BLOCK)  # fmt: skip
    assert alone == [0], "held to the mean at every step, the prompt would stall"
    assert 3 <= sum(1 for g in beside if g) <= len(beside) - 3, beside
    for g in beside:
        chunk = (PrefillChunk(g, prefix),) if g else ()
        assert MODEL.step_seconds(StepBatch(chunk, 1, CHAT_PROMPT)) <= TARGET_MS / 1000
        prefix += g
    sim = simulated(BATCH_PROMPT, chat_at=ALONE_STEPS, steps=len(steps), mean_ms=MEAN_MS,
                    chat_tokens=16)  # fmt: skip
    assert sim == steps


def test_the_simulators_engine_moves_batch_beside_a_chat_prompt_that_finds_no_kv(seen):
    """As the plug-in does, less the empty step, which the simulated engine takes at once."""
    real = [s for s in seen["kv_stall"]["steps"] if s]
    sim = simulated(400, chat_at=1, steps=len(real), kv_blocks=30, max_tokens=4)
    assert sim == real


def test_the_simulators_engine_applies_the_tail_scale_as_the_plugin_does(seen):
    """At a scale a slow spell set to 3x, a fixed target's chunk does not fit and a controller's
    (`tail_scale` off, the model corrected by the sender) gets what the plug-in grants."""
    from scheduler.step import PrefillChunk, StepBatch

    def first_grant(tail_scale: bool) -> int:
        params = EngineParams(
            kv_capacity_tokens=12_500 * BLOCK, block_size=BLOCK,
            max_num_batched_tokens=STEP_TOKENS, long_prefill_token_threshold=STEP_TOKENS,
            max_num_seqs=16, enable_prefix_caching=False,
        )  # fmt: skip
        eng = EngineScheduler(params, KVCache(12_500 * BLOCK, BLOCK, False))
        for _ in range(40):
            eng.scale.observe(0.0, 0.030, 0.010)
        block_s = MODEL.step_seconds(StepBatch((PrefillChunk(BLOCK, 0),)))
        eng.batch_target = BatchStepTarget(2 * block_s, MODEL, tail_scale=tail_scale)
        segments = (Segment(("batch",), BATCH_PROMPT),)
        eng.add(Request("batch", "batch", "chat", BATCH_PRIORITY, 0.0, segments, 10, ("o",)))
        s = eng.schedule(0.0)
        return sum(n for _, n in s.prefills) if s is not None else 0

    assert first_grant(tail_scale=True) == 0
    assert first_grant(tail_scale=False) == seen["stale_scale"]["unscaled"]["batch"]
