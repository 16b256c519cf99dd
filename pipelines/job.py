"""The nightly summarization job on Ray Data: read → judge → tokenize and summarize → write.

The driver reads the corpus, judges it (duplicates need the whole view) and owns the run's files;
Ray Data runs the summarizers, each tokenizing the documents it takes; the Gate actor decides what may run where. Documents stream back to the driver as they
finish and are written at once, so progress is visible and a killed run keeps what it did.
`ray.init()` starts Ray locally; with `RAY_ADDRESS` set (as `ray job submit` sets it) the same code
joins a running cluster, and the run stops only what it started (`pipelines/ray_session.py`).

On a cluster the driver and the Gate share the driver's node, but not its working directory (a
Ray worker's is its node's), so every path either of them opens is made absolute on the driver
first. The engine config's path goes to the summarizers as given: each node resolves it against
its own checkout (the job's `working_dir`, or where its `ray start` ran).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.config import PipelineConfig
from pipelines.corpus import classify, read_corpus
from pipelines.errors import GateLost
from pipelines.gate_setup import DEFAULT_DOWN_GRACE_S
from pipelines.leftovers import release_unreferenced
from pipelines.progress import RunProgress
from pipelines.request_journal import GATE_DIED_IN_FLIGHT, KILLED_IN_FLIGHT
from pipelines.run_metrics import RunMetrics
from pipelines.run_store import RunStore
from pipelines.stop_drain import StopDrain
from scheduler.budget_controller import BudgetControllerConfig
from scheduler.slo import SLO
from serving.engine_config import EngineConfig, load_engine_config
from serving.engine_itl import EngineItlRecorder
from serving.replica_auth import ReplicaAuth
from warehouse.run_files import RunMeta

log = logging.getLogger("nightshift.job")
RELAY_TIMEOUT_S = 2.0
"""Longest a scrape of the run's port waits for the Gate's series (Prometheus gives up at 10 s)."""


@dataclass
class JobSpec:
    """Everything one run needs; the CLI and the Prefect flow build it."""

    corpus: str
    engine_config: str
    replicas: list[tuple[str, str]]
    run_id: str
    results: str = "results"
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    slo: SLO = field(default_factory=SLO)
    policy: str = "slo"
    controller: BudgetControllerConfig | None = None
    """Controller tuning; None takes the engine config's `controller:` section (or the defaults)."""
    latency_model: str | None = None
    """The fit the plug-in prices chunks with; None takes the engine config's
    (`engine_configs/fits/<name>.json`)."""
    static_caps: tuple[int, int] = (4, 2048)
    budget: tuple[int, float] = (4, 40.0)
    """Seats and batch step target (ms) of policy `budget`."""
    engine_state_dir: str = "results/engines"
    """Where replicas started on this host keep their control folders; others are steered over
    their control route."""
    sensor: dict | None = None
    """The Gate's sensor spec (`pipelines.gate_setup.build_sensor`); None reads each replica's
    `/metrics` with p99s sliding over the SLO's window, the span the SLO is judged over, and ITL
    from the engine's histogram, the figure the run's windows are judged by."""
    interval_s: float = 2.0
    down_grace_s: float = DEFAULT_DOWN_GRACE_S
    """How long the night waits for a replica to answer again once every replica is down, before
    the documents waiting fail (`pipelines.gate_setup.GateConfig`)."""
    metrics: RunMetrics | None = None
    """Where the run's and the Gate's series go (the flow serves and pushes them for the night);
    None keeps them in the process only."""
    show_progress: bool = True
    stop_after_s: float | None = None
    """Stop this long after summarizing starts (benchmarks): nothing more is granted and requests
    in flight are cancelled, so the replicas are free at once; unfinished documents stay to do."""
    auth: ReplicaAuth | None = None
    """The replicas' API key and headers, for every request to them (never written down)."""
    deadline_ts: float | None = None
    """Unix time after which nothing more is granted (the night's deadline); requests in flight
    finish, documents not finished are left to do, and the run ends partial."""
    on_summarize_start: Callable[[], None] | None = None
    """Called once documents are tokenized and judged, just before the first permit is asked for
    (a benchmark starts its chat load and its clock here)."""


@dataclass
class JobResult:
    run_id: str
    run_dir: Path
    docs_total: int
    docs_done: int
    docs_failed: int
    docs_skipped: int
    docs_already_done: int
    docs_stopped: int
    batch_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.batch_tokens / max(self.seconds, 1e-9)


def run_job(spec: JobSpec) -> JobResult:
    """Run (or resume) one summarization run to the end and return its totals."""
    release_unreferenced()  # what the work before left in this process
    spec = driver_paths(spec)
    engine = load_engine_config(spec.engine_config)
    corpus = read_corpus(spec.corpus)  # a bad corpus fails here, before any work
    store = RunStore(spec.results, spec.run_id)
    meta = store.begin(
        RunMeta(
            run_id=spec.run_id,
            engine_config=engine.name,
            policy=spec.policy,
            hardware_count=engine.hardware.count,
            replicas=len(spec.replicas),
            hourly_usd=engine.hardware.hourly_usd,
            slo=spec.slo.model_dump(),
            corpus_path=str(spec.corpus),
        )
    )
    killed = store.recover_journal()  # requests of an earlier attempt that died mid-night
    if killed:
        log.warning(
            "run %s: %d requests of an earlier, killed attempt recorded", spec.run_id, len(killed)
        )
    already = store.finished_doc_ids()
    todo = corpus.filter(
        pc.invert(pc.is_in(corpus.column("doc_id"), pa.array(sorted(already), pa.string())))
    )
    t0 = time.time()
    metrics = spec.metrics or RunMetrics(spec.run_id)
    import ray

    with contextlib.closing(_init_ray()):  # disconnects from a cluster it joined, nothing else
        gate = _start_gate(spec, engine, store.new_journal())
        metrics.relay(lambda: ray.get(gate.metrics_text.remote(), timeout=RELAY_TIMEOUT_S))
        totals, problems = {"done": 0, "failed": 0, "stopped": 0, "tokens": 0}, []
        stopping = threading.Event()  # set when a timer stops the Gate (`pipelines.stop_drain`)
        timers = [_stop_at_deadline(gate, spec.deadline_ts, stopping)]
        itl = EngineItlRecorder(spec.replicas, plugin_status=_status_targets(spec))
        gate_lost = False
        try:
            with itl:
                if todo.num_rows:
                    accepted, problems = _judge(todo, spec)
                    store.write_rejections(problems)
                    metrics.documents_refused(problems)
                    if spec.on_summarize_start is not None:
                        spec.on_summarize_start()
                    timers.append(_stop_later(gate, spec.stop_after_s, stopping))
                    totals = _summarize(ray, accepted, spec, engine, store, gate, metrics, stopping)
        except Exception as exc:
            if _gate_alive(ray, gate):
                raise
            gate_lost = True
            message = _gate_lost_message(spec.run_id, len(store.finished_doc_ids()), exc)
            log.error("%s", message)
            raise GateLost(message) from exc
        finally:
            for timer in timers:
                if timer is not None:
                    timer.cancel()
            metrics.relay(None)
            _stop_gate(ray, gate)
            # What this attempt cancelled in flight, or what the Gate had granted when it died,
            # and the Gate's decisions and engine-step rows up to its last.
            store.recover_journal(GATE_DIED_IN_FLIGHT if gate_lost else KILLED_IN_FLIGHT)
            store.write_engine_histograms(itl.series.rows(spec.run_id), itl.ttft.rows(spec.run_id))
    store.finish(meta)
    return JobResult(
        run_id=spec.run_id,
        run_dir=store.dir,
        docs_total=corpus.num_rows,
        docs_done=totals["done"],
        docs_failed=totals["failed"] + sum(p["status"] == "failed" for p in problems),
        docs_skipped=sum(p["status"] == "skipped" for p in problems),
        docs_already_done=len(already),
        docs_stopped=totals["stopped"],
        batch_tokens=totals["tokens"],
        seconds=time.time() - t0,
    )


def _stop_at_deadline(gate, deadline_ts: float | None, stopping: threading.Event):
    """A timer that stops all granting at `deadline_ts`, letting requests in flight finish (at
    once when it has passed already), and sets `stopping`."""
    if deadline_ts is None:
        return None
    at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(deadline_ts))
    delay = max(0.0, deadline_ts - time.time())
    if not delay:
        log.warning("the night's deadline %s has passed: nothing will be admitted", at)
    timer = threading.Timer(delay, _stop_gate_then_set, (gate, f"deadline {at}", False, stopping))
    timer.daemon = True
    timer.start()
    return timer


def _stop_later(gate, after_s: float | None, stopping: threading.Event):
    """A timer that tells the Gate to stop granting seats after `after_s` seconds (cancelling
    requests in flight), and sets `stopping`."""
    if after_s is None:
        return None
    timer = threading.Timer(
        after_s, _stop_gate_then_set, (gate, f"deadline of {after_s:.0f} s", True, stopping)
    )
    timer.daemon = True
    timer.start()
    return timer


def _stop_gate_then_set(gate, reason: str, abort: bool, stopping: threading.Event) -> None:
    """Tell the Gate to stop, then the driver that it was told (the Gate answers its
    `settled_docs` only once it has stopped, so the order needs no wait)."""
    gate.stop.remote(reason, abort=abort)
    stopping.set()


def driver_paths(spec: JobSpec) -> JobSpec:
    """`spec` with the paths the driver and the Gate open made absolute (the Gate runs on the
    driver's node, in its node's working directory): results (the run folder and the Gate's
    journal), the replicas' control folders and the latency fit. Not the engine config: the
    summarizers open it on every node."""
    absolute = os.path.abspath
    return replace(
        spec,
        results=absolute(spec.results),
        engine_state_dir=absolute(spec.engine_state_dir),
        latency_model=absolute(spec.latency_model) if spec.latency_model else None,
    )


def _init_ray():
    """Join the cluster `RAY_ADDRESS` names or start Ray here (`pipelines/ray_session.py`), and
    set Ray Data up for the run; returns the session, whose `close()` the run calls at its end."""
    from ray.data import DataContext

    from pipelines.ray_session import open_ray

    session = open_ray()
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False  # the run draws its own progress
    ctx.execution_options.preserve_order = False
    return session


def _status_targets(spec: JobSpec) -> dict:
    """Where each replica's plug-in status is read: chat's own gaps judge the run's windows."""
    from serving.replica_targets import control_targets

    auth = spec.auth or ReplicaAuth()
    return control_targets(spec.replicas, spec.engine_state_dir, auth.api_key, auth.headers)


def _start_gate(spec: JobSpec, engine: EngineConfig, journal: Path):
    from pipelines.gate import start_gate
    from pipelines.gate_setup import GateConfig
    from pipelines.slack_marks import last_slack_marks
    from serving.replica_targets import configured_fit, control_targets

    fit = None if spec.latency_model else configured_fit(spec.engine_config, engine)
    latency_model = spec.latency_model or (os.path.abspath(fit) if fit else None)

    marks = {}
    if spec.policy == "slo":  # a replica's spread outlives a run (`pipelines/slack_marks.py`)
        names = [name for name, _ in spec.replicas]
        marks = last_slack_marks(spec.results, engine.name, names, spec.slo.model_dump())
        if marks:
            log.info("run %s: slack marks earlier runs left: %s", spec.run_id, marks)
    # ITL from the engine's histogram even where chat streams its gaps to the Gate: that is what
    # the run's SLO windows are judged by (sql/slo_windows.sql), and client gaps carry host noise.
    sensor = spec.sensor or {"kind": "vllm", "window_s": spec.slo.window_s, "itl": "engine"}
    auth = spec.auth or ReplicaAuth()
    config = GateConfig(
        policy=spec.policy,
        slo=spec.slo,
        latency_model=latency_model,
        static_caps=spec.static_caps,
        budget=spec.budget,
        control_targets=control_targets(
            spec.replicas, spec.engine_state_dir, auth.api_key, auth.headers
        ),
        auth=auth,
        sensor=sensor,
        interval_s=spec.interval_s,
        down_grace_s=spec.down_grace_s,
        controller=spec.controller or engine.controller,
        engine_flags=engine.vllm,
        journal=str(journal),
        slack_marks=marks,
    )
    return start_gate(spec.run_id, spec.replicas, config=config)


def _stop_gate(ray, gate) -> None:
    try:
        ray.get(gate.close.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        pass  # dead already (see `_gate_alive`): nothing of it left to close
    finally:
        ray.kill(gate)


def _gate_alive(ray, gate) -> bool:
    """False only when Ray says the Gate actor is dead; a Gate slow to answer is alive. Without
    its Gate an attempt cannot go on: nothing grants seats, and the control documents it renewed
    expire, so the engine plug-ins pause batch prefill."""
    try:
        ray.get(gate.stats.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return True
    return True


def _gate_lost_message(run_id: str, finished: int, exc: BaseException) -> str:
    """What a user reads when the Gate died: the innermost error (a worker's call to the dead
    Gate arrives wrapped in Ray Data's task errors), what was kept, and how to resume."""
    root = _innermost(exc)
    first = (re.sub(r"\x1b\[[0-9;]*m", "", str(root)).strip().splitlines() or [""])[0][:200]
    return (
        f"run {run_id}: the run's Gate actor died mid-night ({type(root).__name__}: {first}); "
        f"the {finished} documents finished so far are kept and the requests it had granted are "
        f"recorded as killed; rerun with --run-id {run_id} to finish the rest (the nightly flow "
        "retries the pipeline once by itself)"
    )


def _innermost(exc: BaseException) -> BaseException:
    """Follow `cause` (Ray's task errors) and `__cause__` to the error that started it all."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def _judge(corpus: pa.Table, spec: JobSpec) -> tuple[pa.Table, list[dict]]:
    """Judge every document on the driver, which has the whole view duplicates need, from its
    text alone: read problems, empty or not UTF-8 text, a taken id, the same text as an earlier
    document. Over-long documents are failed by the summarizer that tokenizes them
    (`DocumentJob.layout`), so nothing waits for the whole corpus to be tokenized.

    Returns the documents to summarize (`doc_id`, `text`) and the rows of those refused."""
    verdicts = classify(corpus, None, [None] * corpus.num_rows)
    ids = corpus.column("doc_id").to_pylist()
    problems = [
        {
            "doc_id": ids[i],
            "status": v.status,
            "reason": v.reason,
            "prompt_tokens": None,
            "sections": 0,
            "summary_tokens": 0,
            "t_done": time.time(),
        }
        for i, v in enumerate(verdicts)
        if v is not None
    ]
    keep = pa.array([i for i, v in enumerate(verdicts) if v is None], pa.int64())
    return corpus.select(["doc_id", "text"]).take(keep), problems


def _summarize(
    ray,
    accepted: pa.Table,
    spec: JobSpec,
    engine: EngineConfig,
    store: RunStore,
    gate,
    metrics: RunMetrics,
    stopping: threading.Event,
) -> dict:
    """Summarize every document of `accepted`, writing outcomes as they come. Once the Gate has
    stopped, the night ends as soon as every document it granted has reported; the rest are
    counted stopped without a summarizer telling each one so (`pipelines.stop_drain`)."""
    from pipelines.workers import Summarize

    total = accepted.num_rows
    metrics.remaining.set(total)
    totals = {"done": 0, "failed": 0, "stopped": 0, "tokens": 0}
    if not total:
        return totals
    cfg = spec.pipeline
    # One block (one task) per document, so every actor gets work and a long document holds up
    # no other; `docs_per_actor` of those tasks run at once on each actor. Their coroutines share
    # the actor's event loop: most of a document's time is spent waiting for a seat or a stream.
    docs = ray.data.from_arrow(accepted).repartition(total)
    outcomes = docs.map_batches(
        Summarize,
        fn_constructor_kwargs={
            "run_id": spec.run_id,
            "engine_config": spec.engine_config,
            "config": cfg.model_dump(),
            "auth": spec.auth,
        },
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=0.25,
        compute=ray.data.ActorPoolStrategy(
            size=cfg.actors,
            max_concurrent_calls_per_actor=cfg.docs_per_actor_for(
                len(spec.replicas), engine.sequence_slots
            ),
        ),
    )
    drain = StopDrain()
    # Closed on the way out, so that a night ended early (`drain`) shuts Ray Data's executor down
    # now, not whenever its iterator is collected: a benchmark runs its next night in this Ray.
    blocks = contextlib.closing(finished_blocks(ray, outcomes))
    with RunProgress(total, enabled=spec.show_progress) as progress, blocks as finished:
        for block in finished:
            rows = block.to_pylist()
            store.write_outcomes(rows)
            caps = ray.get(gate.caps.remote())
            for r in rows:
                totals[r["status"]] += 1
                totals["tokens"] += r["batch_tokens"]
                metrics.document_done(r["status"], r["batch_tokens"])
                _observe_requests(metrics, r)
                progress.update(r["batch_tokens"], caps)
            drain.reported_outcomes(r["doc_id"] for r in rows)
            if stopping.is_set() and drain.settled(lambda: ray.get(gate.settled_docs.remote())):
                left = total - len(drain.reported)
                totals["stopped"] += left
                metrics.documents_stopped(left)
                log.info("the Gate has stopped: %d documents not started are left to do", left)
                break
    return totals


def finished_blocks(ray, dataset):
    """The dataset's blocks as they finish, each an Arrow table (a bundle's slice applied).

    Not `iter_batches`: every few seconds it sends the dataset's whole statistics, which hold an
    entry per block so far, to Ray Data's stats actor, and with a block per document that actor
    grows through the night by the size of the largest such message. Blocks read by reference
    send it nothing."""
    for bundle in dataset.iter_internal_ref_bundles():
        for entry, part in zip(bundle.blocks, bundle.slices, strict=True):
            block = ray.get(entry.ref)
            yield block if part is None else block.slice(part.start_offset, part.num_rows)


def _observe_requests(metrics: RunMetrics, outcome: dict) -> None:
    import json

    gaps_by_request: dict[str, list[float]] = {}
    for g in json.loads(outcome["gaps"]):
        gaps_by_request.setdefault(g["request_id"], []).append(g["gap_s"])
    for row in json.loads(outcome["requests"]):
        metrics.observe_request(row, gaps_by_request.get(row["request_id"], []))
