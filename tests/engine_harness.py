"""Drives vLLM's real v1 scheduler classes, stock and with the plug-in, with no model behind them.

Runs in the engine environment (`.venv-engine/bin/python -m tests.engine_harness CASE...`), which
has vLLM; prints one JSON object of what each case observed, for `test_budget_scheduler.py` to
judge. A fake model output samples one token for every request whose scheduled tokens reach the
end of what it had to compute, exactly what the model runner would report.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # no model runs here

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from serving import engine_control, local_models
from serving.engine_site import budget_scheduler
from serving.engine_site.control_files import CONTROL_DIR_ENV
from serving.engine_site.step_log import STEP_LOG_ENV
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

BUDGET = STEP_TOKENS


def make(cls: type, folder: Path | None, blocks: int = 8000, caching: bool = False):
    if folder is None:
        os.environ.pop(CONTROL_DIR_ENV, None)
    else:
        os.environ[CONTROL_DIR_ENV] = str(folder)
    model = ModelConfig(
        model=str(local_models.resolve("tiny")), dtype="float32", max_model_len=40000
    )
    sched = SchedulerConfig(
        max_num_seqs=16,
        max_num_batched_tokens=BUDGET,
        max_model_len=40000,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=BUDGET,
        policy="priority",
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=caching)
    cache.num_gpu_blocks = blocks
    config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(blocks, [], [KVCacheGroupSpec(["layer"], spec)])
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=False,
    )


def request(
    rid: str, prompt: int, priority: int, max_tokens: int = 8, first: int = 0, hasher=None
) -> Request:
    """A request of `prompt` tokens; prompts of different `first` share no full block."""
    return Request(
        request_id=rid,
        prompt_token_ids=[1 + (first + i) % 1000 for i in range(prompt)],
        block_hasher=hasher,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
        arrival_time=time.time(),
    )


def step(s) -> dict[str, int]:
    """One schedule + fake model output; the tokens each request got."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = s.requests[rid]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    runner = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled)
    s.update_from_output(out, runner)
    return dict(out.num_scheduled_tokens)


def send(
    folder: Path,
    seq: int,
    target_ms: float,
    ttl_s: float = 60.0,
    pause: bool = False,
    horizon_s: float | None = None,
    tail_scale: bool = True,
):
    doc = engine_control.decision_document(
        seq, target_ms, MODEL, ttl_s, pause, chat_cache_horizon_s=horizon_s, tail_scale=tail_scale
    )
    engine_control.send(engine_control.ControlTarget("harness", folder=folder), doc)
    time.sleep(0.03)  # one poll interval of the plug-in


def chat_arrives_mid_prefill(cls, folder, target_ms):
    """A 16k batch prompt prefilling; after 3 steps a 300-token chat arrives: per-step tokens."""
    s = make(cls, folder)
    if folder is not None and target_ms is not None:
        send(folder, 1, target_ms)
    s.add_request(request("batch", BATCH_PROMPT, 10))
    steps = [step(s) for _ in range(3)]
    s.add_request(request("chat", CHAT_PROMPT, 0))
    steps += [step(s) for _ in range(6)]
    return steps


def case_stock_vs_inert(folder: Path) -> dict:
    return {
        "stock": chat_arrives_mid_prefill(Scheduler, None, None),
        "inert": chat_arrives_mid_prefill(budget_scheduler.BudgetScheduler, folder, None),
    }


def case_target(folder: Path) -> dict:
    return {"steps": chat_arrives_mid_prefill(budget_scheduler.BudgetScheduler, folder, TARGET_MS)}


def case_async(folder: Path) -> dict:
    """The GPU variant (vLLM's AsyncScheduler underneath), stepped as the sync cases are."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return {
        "stock": chat_arrives_mid_prefill(AsyncScheduler, None, None),
        "target": chat_arrives_mid_prefill(
            budget_scheduler.AsyncBudgetScheduler, folder, TARGET_MS
        ),
    }


def case_change(folder: Path) -> dict:
    s = make(budget_scheduler.BudgetScheduler, folder)
    send(folder, 1, 30.0)
    s.add_request(request("batch", 16000, 10))
    first = step(s)["batch"]
    send(folder, 2, 50.0)
    second = step(s)["batch"]
    send(folder, 3, 0.0, pause=True)
    paused = step(s).get("batch", 0)
    return {"first": first, "second": second, "paused": paused, "status": _status(s, folder)}


def case_expiry(folder: Path) -> dict:
    s = make(budget_scheduler.BudgetScheduler, folder)
    send(folder, 1, 50.0, ttl_s=0.3)
    s.add_request(request("decoding", 32, 10, max_tokens=50))
    s.add_request(request("batch", 16000, 10))
    before = step(s)
    time.sleep(0.35)
    s.add_request(request("chat", 64, 0, max_tokens=50))
    after = [step(s) for _ in range(3)]
    return {"before": before, "after": after, "status": _status(s, folder)}


def case_malformed(folder: Path) -> dict:
    s = make(budget_scheduler.BudgetScheduler, folder)
    send(folder, 1, 30.0)
    s.add_request(request("batch", 16000, 10))
    valid = step(s)["batch"]
    (folder / "control.json").write_text('{"seq": 2, "batch_step_target_ms": "fast"')
    time.sleep(0.03)
    s.add_request(request("chat", 300, 0))
    after = [step(s) for _ in range(3)]
    return {"valid": valid, "after": after, "status": _status(s, folder)}


def case_kv_stall(folder: Path) -> dict:
    """A 30-block KV pool: a 400-token batch prompt half prefilled leaves too few blocks for a
    300-token chat prompt, which can start only once the batch request finishes."""
    s = make(budget_scheduler.BudgetScheduler, folder, blocks=30)
    send(folder, 1, TARGET_MS)
    s.add_request(request("batch", 400, 10, max_tokens=4))
    steps = [step(s)]
    s.add_request(request("chat", CHAT_PROMPT, 0))
    for _ in range(12):
        steps.append(step(s))
        if "chat" in steps[-1]:
            break
    return {"steps": steps}


def case_stale_scale(folder: Path) -> dict:
    """The model's scale at its bound after a spell of slow batch steps, under a target of twice
    one block's bare price: no chunk fits, unless the document says the sender corrects the
    model itself (`tail_scale` off); then that evidence grows older than the scale keeps it."""
    from collections import deque

    from scheduler.step import PrefillChunk, StepBatch
    from scheduler.step_scale import SAMPLE_LIFE_S

    s = make(budget_scheduler.BudgetScheduler, folder)
    block_ms = 1000 * MODEL.step_seconds(StepBatch((PrefillChunk(BLOCK, 0),)))
    send(folder, 1, 2 * block_ms)
    scale = s._nightshift.scale
    for _ in range(40):
        scale.observe(time.monotonic(), 0.030, 0.010)  # 3x the model
    s.add_request(request("batch", BATCH_PROMPT, 10))
    latched = [step(s) for _ in range(2)]
    send(folder, 2, 2 * block_ms, tail_scale=False)
    unscaled = step(s)
    status = _status(s, folder)
    send(folder, 3, 2 * block_ms)
    scale.sized = deque(((t - SAMPLE_LIFE_S - 1, r) for t, r in scale.sized), scale.sized.maxlen)
    freed = [step(s) for _ in range(2)]
    return {"latched": latched, "unscaled": unscaled, "freed": freed, "scale": scale.value,
            "unscaled_status": status}  # fmt: skip


def case_garbage_first(folder: Path) -> dict:
    (folder / "control.json").write_text("not json at all")
    s = make(budget_scheduler.BudgetScheduler, folder)
    s.add_request(request("batch", 16000, 10))
    return {"steps": [step(s) for _ in range(2)], "status": _status(s, folder)}


def case_eviction(folder: Path) -> dict:
    """64 KV blocks of 16 tokens with prefix caching: a chat, then a batch document, run to their
    end; then a second document needs more blocks than were never used, and fewer than those and
    the first document's together. How much of the chat prompt, sent again, is still cached:
    stock vLLM, and the plug-in with a controller in charge."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    out = {}
    for name, cls, f in (("stock", Scheduler, None),
                         ("plugin", budget_scheduler.BudgetScheduler, folder)):  # fmt: skip
        s = make(cls, f, blocks=64, caching=True)
        if f is not None:
            send(f, 1, 1000.0)  # a target no step reaches: only the eviction order differs
        for rid, tokens, prio, first in (("chat", 256, 0, 0), ("doc", 480, 10, 300),
                                         ("doc2", 640, 10, 600)):  # fmt: skip
            s.add_request(request(rid, tokens, prio, max_tokens=2, first=first, hasher=hasher))
            while s.requests.get(rid) is not None:
                step(s)
        again = request("chat-again", 256, 0, max_tokens=2, hasher=hasher)
        out[name] = s.kv_cache_manager.get_computed_blocks(again)[1]
    return out


def case_chat_cache(folder: Path) -> dict:
    """Chat's prefix-cache working set in the status, with prefix caching: none counted without
    a horizon; a finished 256-token chat's full blocks; what is left while the same prompt, sent
    again, holds them; a finished batch document adds nothing; a horizon of 0 counts nothing."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    s = make(budget_scheduler.BudgetScheduler, folder, blocks=256, caching=True)
    seen = {}

    def run(rid: str, tokens: int, prio: int, first: int) -> None:
        s.add_request(request(rid, tokens, prio, max_tokens=2, first=first, hasher=hasher))
        while s.requests.get(rid) is not None:
            step(s)

    send(folder, 1, 1000.0)
    run("chat0", 256, 0, 700)
    seen["no horizon"] = _status(s, folder)["chat_cache_tokens"]
    send(folder, 2, 1000.0, horizon_s=600.0)
    run("chat", 256, 0, 0)
    seen["chat left"] = _status(s, folder)["chat_cache_tokens"]
    s.add_request(request("again", 256, 0, max_tokens=2, hasher=hasher))
    step(s)
    seen["held again"] = _status(s, folder)["chat_cache_tokens"]
    while s.requests.get("again") is not None:
        step(s)
    run("doc", 480, 10, 300)
    seen["after a document"] = _status(s, folder)["chat_cache_tokens"]
    send(folder, 3, 1000.0, horizon_s=0.0)
    step(s)
    seen["horizon 0"] = _status(s, folder)["chat_cache_tokens"]
    return seen


def case_canary(folder: Path) -> dict:
    """Every vLLM internal the plug-in relies on (budget_scheduler's docstring), by name,
    signature and call site; a list of what changed, empty when nothing did."""
    import inspect

    import vllm
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    problems = []
    signatures = {
        "schedule": ["self", "throttle_prefills"],
        "_reserve_prefill_lookahead": ["self", "request", "num_computed_tokens", "num_new_tokens"],
        "update_from_output": ["self", "scheduler_output", "model_runner_output"],
    }
    for name, params in signatures.items():
        fn = getattr(Scheduler, name, None)
        got = list(inspect.signature(fn).parameters) if fn else None
        if got != params:
            problems.append(f"Scheduler.{name} signature is {got}, the plug-in expects {params}")
    source = inspect.getsource(Scheduler.schedule)
    calls = source.count("self._reserve_prefill_lookahead(")
    if calls != 2:
        problems.append(f"schedule() calls _reserve_prefill_lookahead {calls} times, not 2 "
                        "(once for running, once for waiting requests)")  # fmt: skip
    elif source.index("long_prefill_token_threshold < num_new_tokens") > source.index(
        "self._reserve_prefill_lookahead("
    ):
        problems.append("schedule() applies long_prefill_token_threshold after the hook")
    if not issubclass(AsyncScheduler, Scheduler):
        problems.append("AsyncScheduler no longer subclasses Scheduler")
    problems += _engine_core_problems()
    s = make(budget_scheduler.BudgetScheduler, folder)
    for attr in ("running", "waiting", "requests", "block_size", "max_num_scheduled_tokens",
                 "max_num_running_reqs", "policy", "scheduler_config", "connector",
                 "parallel_config", "get_num_unfinished_requests"):  # fmt: skip
        if not hasattr(s, attr):
            problems.append(f"Scheduler has no attribute {attr!r}")
    pool = s.kv_cache_manager.block_pool
    for owner, attrs in ((pool, ("enable_caching", "free_block_queue")),
                         (pool.free_block_queue, ("remove", "prepend_n")),
                         (pool.free_block_queue.fake_free_list_head.next_free_block,
                          ("ref_cnt", "is_null", "prev_free_block", "block_id",
                           "block_hash"))):  # fmt: skip
        for attr in attrs:
            if not hasattr(owner, attr):
                problems.append(f"{type(owner).__name__} has no attribute {attr!r}")
    if not hasattr(s.kv_cache_manager.get_blocks("none"), "blocks"):
        problems.append("KVCacheManager.get_blocks(...) has no .blocks")
    free = getattr(Scheduler, "_free_request_blocks", None)
    if free is None or list(inspect.signature(free).parameters) != ["self", "request"]:
        problems.append("Scheduler._free_request_blocks(request) is gone or changed")
    elif "self._free_request_blocks(" not in inspect.getsource(Scheduler._free_blocks):
        problems.append("Scheduler._free_blocks no longer frees through _free_request_blocks")
    if not hasattr(s.scheduler_config, "long_prefill_token_threshold"):
        problems.append("SchedulerConfig has no long_prefill_token_threshold")
    r = request("probe", 32, 5)
    for attr in ("request_id", "priority", "num_tokens", "num_computed_tokens",
                 "num_output_tokens", "arrival_time", "is_finished"):  # fmt: skip
        if not hasattr(r, attr):
            problems.append(f"Request has no attribute {attr!r}")
    s.add_request(request("new", 32, 0))
    news = getattr(s.schedule(), "scheduled_new_reqs", None)
    if not news or not all(hasattr(news[0], a) for a in ("req_id", "block_ids")):
        problems.append("SchedulerOutput.scheduled_new_reqs[...] lacks .req_id or .block_ids")
    elif not all(isinstance(g, list) for g in news[0].block_ids):
        problems.append("NewRequestData.block_ids is no longer one list of ids per KV group")
    for prio in (10, 0, 5):
        s.add_request(request(f"q{prio}", 32, prio))
    order = [q.priority for q in s.waiting]
    if order != [0, 5, 10]:
        problems.append(f"iterating the waiting queue gives priorities {order}, not in order")
    return {"vllm": vllm.__version__, "problems": problems}


def _engine_core_problems() -> list[str]:
    """What the idle hold (serving/engine_site/idle_hold.py) relies on in the engine core: it owns
    the scheduler as `.scheduler`, calls `schedule` from `step` (and the batch-queue step), and
    takes every request, abort and wake-up through `.input_queue`, a `queue.Queue`."""
    import inspect

    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    problems = []
    sources = {
        "EngineCore.__init__": (EngineCore.__init__, "self.scheduler: SchedulerInterface = "),
        "EngineCore.step": (EngineCore.step, "self.scheduler.schedule("),
        "EngineCore.step_with_batch_queue": (
            EngineCore.step_with_batch_queue,
            "self.scheduler.schedule(",
        ),
        "EngineCoreProc.__init__": (EngineCoreProc.__init__, "self.input_queue = queue.Queue"),
        "EngineCoreProc.process_input_sockets": (
            EngineCoreProc.process_input_sockets,
            "self.input_queue.put_nowait(",
        ),
    }
    for where, (fn, text) in sources.items():
        if text not in inspect.getsource(fn):
            problems.append(f"{where} no longer has {text!r}")
    return problems


def case_mean(folder: Path) -> dict:
    """A batch prompt prefills alone, then a chat arrives and decodes beside it, under a mean
    step target too short for a block deep in the prompt: what each step schedules."""
    s = make(budget_scheduler.BudgetScheduler, folder)
    doc = engine_control.decision_document(1, TARGET_MS, MODEL, 60.0, mean_target_ms=MEAN_MS)
    engine_control.send(engine_control.ControlTarget("harness", folder=folder), doc)
    time.sleep(0.03)
    s.add_request(request("batch", BATCH_PROMPT, 10))
    steps = [step(s) for _ in range(ALONE_STEPS)]
    s.add_request(request("chat", CHAT_PROMPT, 0, max_tokens=16))
    return {"steps": steps + [step(s) for _ in range(14)]}


def case_idle(folder: Path) -> dict:
    """A batch prompt alone under a target too tight for any chunk, with an idle target; then a
    chat arrives: what batch gets per step before and after."""
    s = make(budget_scheduler.BudgetScheduler, folder)
    doc = engine_control.decision_document(1, 1.0, MODEL, 60.0, idle_target_ms=TARGET_MS)
    engine_control.send(engine_control.ControlTarget("harness", folder=folder), doc)
    time.sleep(0.03)
    s.add_request(request("batch", BATCH_PROMPT, 10))
    alone = [step(s) for _ in range(3)]
    s.add_request(request("chat", CHAT_PROMPT, 0, max_tokens=16))
    beside = [step(s) for _ in range(4)]
    return {"alone": alone, "beside": beside}


def case_step_log(folder: Path) -> dict:
    """The chat-mid-prefill scenario with the step log on: what the log holds beside what ran."""
    log = folder / "steps.jsonl"
    os.environ[STEP_LOG_ENV] = str(log)
    try:
        steps = chat_arrives_mid_prefill(budget_scheduler.BudgetScheduler, folder, TARGET_MS)
    finally:
        del os.environ[STEP_LOG_ENV]
    return {"steps": steps, "log": [json.loads(line) for line in log.read_text().splitlines()]}


class EngineCoreStandIn:
    """Stands to the scheduler where vLLM's engine core does: it owns the scheduler and the input
    queue vLLM's input thread fills, and calls `schedule` from its own method (the plug-in finds
    it on the call stack)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.input_queue: queue.Queue = queue.Queue()

    def step(self) -> dict[str, int]:
        return step(self.scheduler)


def once_held(q: queue.Queue, then) -> threading.Thread:
    """Run `then` on another thread (as vLLM's input thread would) once this thread waits on
    `q`; it runs anyway after 10 s, and the hold it was meant to end ends without it."""

    def run() -> None:
        deadline = time.monotonic() + 10
        while not q.not_empty._waiters and time.monotonic() < deadline:
            time.sleep(0.001)
        then()

    t = threading.Thread(target=run)
    t.start()
    return t


def case_hold(folder: Path) -> dict:
    """A paused batch prompt alone in an engine, stepped by an engine-core stand-in: what ends
    each hold, what the next step schedules, what the status said meanwhile and the step time it
    counted. Holds end at 1.5 s at the latest here, not the engine's 5."""
    s = make(budget_scheduler.BudgetScheduler, folder)
    engine, plugin = EngineCoreStandIn(s), s._nightshift
    plugin.max_hold_s = 1.5
    send(folder, 1, 0.0, pause=True)
    s.add_request(request("batch", 1024, 10))
    out: dict = {}

    t = once_held(engine.input_queue, lambda: engine.input_queue.put_nowait(("ADD", "chat")))
    out["held"] = engine.step()
    t.join()
    out["chat_woke"] = plugin.last_hold
    engine.input_queue.get_nowait()  # what the engine core's loop does next: add the chat
    s.add_request(request("chat", 64, 0, max_tokens=2))
    out["beside_chat"] = [engine.step() for _ in range(2)]
    out["beside_chat_holds"] = plugin.last_hold

    t = once_held(engine.input_queue, lambda: send(folder, 2, TARGET_MS))
    out["held_again"] = engine.step()
    t.join()
    out["document_woke"] = plugin.last_hold
    out["resumed"] = engine.step()

    send(folder, 3, 0.0, pause=True)
    measured, t0, wall = plugin.status.totals.measured_s, time.monotonic(), time.time()
    t = once_held(engine.input_queue, lambda: send(folder, 4, 0.0, pause=True))
    engine.step()
    t.join()
    out["quiet_hold_s"] = time.monotonic() - t0
    out["quiet_measured_s"] = plugin.status.totals.measured_s - measured
    out["quiet_ended"] = plugin.last_hold
    doc = json.loads((folder / "status.json").read_text())
    out["status_during_hold"] = {
        "written": doc["written_at"] > wall + 0.5,
        "seq": doc["control_seq"],
        "state": doc["state"],
    }
    return out


def case_no_engine(folder: Path) -> dict:
    """The same paused batch prompt stepped by hand (as every other case): never held."""
    s = make(budget_scheduler.BudgetScheduler, folder)
    send(folder, 1, 0.0, pause=True)
    s.add_request(request("batch", 1024, 10))
    steps = [step(s) for _ in range(3)]
    return {"steps": steps, "held": s._nightshift.last_hold, "engine": s._nightshift.engine}


def _status(s, folder: Path) -> dict:
    s._nightshift.status._last_write = -1e9
    s._nightshift.status.maybe_write(time.monotonic(), s._nightshift.control_fields)
    return json.loads((folder / "status.json").read_text())


def main(cases: list[str]) -> None:
    results = {}
    for name in cases:
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = globals()[f"case_{name}"](Path(tmp))
    sys.stdout.write("\nRESULT " + json.dumps(results) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
