"""The Gate: one named Ray actor per run that every batch worker asks for a seat before it sends.

Ray Data spreads a night's documents over many workers; admission must still be decided in one place
per replica, or each worker would fill "its" share and together they would flood the engine. So the
Gate holds the policy (the SLO controller, or a baseline), polls the sensors every `interval_s`,
turns each observation into a decision, and hands out permits under the caps it decided:

    permit = await gate.acquire.remote(doc_id, prompt_tokens, max_tokens)   # waits for a seat
    ... stream the request to permit.base_url with priority=permit.priority ...
    gate.release.remote(permit.permit_id, record.row(), gap_rows)            # frees it, feeds back

A cut never revokes a permit already granted: an in-flight prefill cannot be taken back without
wasting it, so a cut only stops new grants until enough permits come back. Every decision is kept
for the run's decisions table and exported to Prometheus.

The chunk size is decided inside the engine: a decision's `batch_step_target_ms` goes to each
replica's engine plug-in as a control document (its folder on this host, its control route
otherwise), renewed every poll with an expiry of a few polls, so a Gate that dies leaves batch
paused rather than uncontrolled. The Gate itself decides seats and checks every grant against the
decision's KV room. Policies `none` and `static` write no control document: the engine is stock.
Batch always runs at a lower priority than chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from pipelines.errors import LeaseLapsed, RunStopped
from pipelines.gate_metrics import GateMetrics
from pipelines.gate_setup import (
    GateConfig,
    build_sensor,
    check_interval,
    load_latency_model,
    plugin_sensor,
    sensor_window_s,
)
from pipelines.request_journal import WORKER_DIED_IN_FLIGHT, RequestJournal
from pipelines.seat_leases import SeatLeases
from scheduler.admission import BatchInFlight, Decision, Observation
from scheduler.budget_controller import BudgetControllerConfig
from serving import engine_control
from serving.engine_control import ControlError
from serving.replica_auth import ReplicaAuth
from serving.sensors import StreamedTimingsSensor

log = logging.getLogger("nightshift.gate")

BATCH_PRIORITY = 10
"""vLLM's `priority` for batch requests: lower runs first and chat sends 0, so batch always yields."""
CONTROL_TTL_POLLS = 3
"""A control document outlives this many polls: one lost write or a slow poll does not pause
batch, a Gate gone for longer does."""
MIN_CONTROL_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Permit:
    """A seat on one replica: send the request there, with this priority, in sections of at most
    `chunk_tokens`, and release it when the request ends (also on failure)."""

    permit_id: str
    replica: str
    base_url: str
    chunk_tokens: int
    priority: int
    granted_at: float


@dataclass
class _Held:
    """A granted permit as the Gate tracks it."""

    permit: Permit
    prompt_tokens: int
    prefilled_tokens: int = 0
    output_tokens: int = 0
    holder: str | None = None
    """The worker holding it, whose lease keeps it (`pipelines/seat_leases.py`); None: no lease,
    held until released."""


@dataclass
class _Replica:
    """One replica's current caps, last observation and the permits it holds."""

    name: str
    base_url: str
    up: bool = True
    down_at: float = 0.0
    """When it was last marked down: only an observation made after that brings it back."""
    decision: Decision | None = None
    observation: Observation | None = None
    granted_kv_tokens: int = 0  # KV of permits granted since the last decision
    control_seq: int = 0
    held: dict[str, _Held] = field(default_factory=dict)

    def free_seats(self) -> int:
        return (self.decision.batch_seats if self.decision else 0) - len(self.held)


class GateActor:
    """The Gate's logic; `Gate` below is this class as a Ray actor. Every method runs on the
    actor's one event loop, so the seat ledger needs no locks, only a condition to wait on."""

    def __init__(
        self,
        run_id: str,
        replicas: Iterable[tuple[str, str]],
        config: GateConfig | None = None,
        **settings: Any,
    ) -> None:
        """`config`, or the same settings as keywords (`GateConfig`'s fields)."""
        if config is not None and settings:
            raise ValueError(f"give a GateConfig or its settings, not both ({', '.join(settings)})")
        config = config or GateConfig(**settings)
        self.config = config
        self.run_id = run_id
        self.journal = RequestJournal(config.journal) if config.journal is not None else None
        """Every grant and release, written before it takes effect (pipelines/request_journal)."""
        self.replicas = {name: _Replica(name, url) for name, url in replicas}
        self.leases = SeatLeases(config.lease_s)
        if not self.replicas:
            raise ValueError("a Gate needs at least one replica (name, base_url)")
        self.slo = config.slo
        self.policy = config.build_policy()
        check_interval(config.policy, config.controller, config.interval_s)
        self.kv_high_water = (config.controller or BudgetControllerConfig()).kv_high_water
        self.kv_guarded = self.policy.guards_kv
        """Baselines are blind to KV by design; the controller's KV room is checked at grants."""
        steers = self.policy.steers_engine
        self.model = load_latency_model(config.policy, config.latency_model) if steers else None
        self.control = dict(config.control_targets or {}) if steers else {}
        sensor = config.sensor or {"kind": "vllm"}
        self.streamed = StreamedTimingsSensor(self.replicas, window_s=sensor_window_s(sensor))
        urls = {r.name: r.base_url for r in self.replicas.values()}
        self.plugin = plugin_sensor(config.control_targets, sensor)
        headers = (config.auth or ReplicaAuth()).http_headers()
        self.sensor = build_sensor(sensor, urls, self.streamed, self.plugin, headers)
        self.interval_s = config.interval_s
        self.metrics = GateMetrics()
        self.metrics.set_slo(self.slo)
        port = config.metrics_port
        self.metrics_port = self.metrics.serve(port) if port is not None else None
        self._rows: list[dict] = []
        self._ids = itertools.count(1)
        self._counts = {"granted": 0, "released": 0, "failed": 0, "polls": 0, "sensor_errors": 0,
                        "control_errors": 0, "expired": 0}  # fmt: skip
        self._waiting = 0
        self._steps_exported = 0
        self._cond = asyncio.Condition()  # binds to the actor's loop on first use
        self._loop_task: asyncio.Task | None = None
        self._stopped: str | None = None
        self._abort = False
        self._granted_docs: set[str] = set()
        """Every document granted a seat by this Gate: once it has stopped, the only ones whose
        outcome can still be anything but `stopped`."""

    # -- permits ----------------------------------------------------------------------------

    async def acquire(
        self,
        doc_id: str,
        prompt_tokens: int,
        max_tokens: int = 0,
        timeout_s: float | None = None,
        stage: str | None = None,
        holder: str | None = None,
    ) -> Permit:
        """Wait for a seat under the current caps and take it on the replica with most headroom.

        A `holder` (the asking worker's id) holds the seat on a lease it renews with `heartbeat`;
        without one the seat is held until released. A dead worker's calls still wait here (Ray
        does not cancel them): once its lease lapsed they raise LeaseLapsed rather than take a
        seat nobody would use or give back. Raises at once (and wakes waiters to raise)
        when none could ever hold the request's KV, and once every replica has been marked down
        for `down_grace_s`; raises TimeoutError after `timeout_s` without a seat."""
        await self._start()
        if holder is not None:
            self.leases.renew(holder, time.monotonic())
        kv_tokens = prompt_tokens + max_tokens
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout_s), self._cond:
                while True:
                    if self._stopped:
                        raise RunStopped(f"run stopped: {self._stopped}")
                    self._check_can_ever_fit(kv_tokens)
                    if holder is not None and holder not in self.leases:
                        raise LeaseLapsed(f"the seat lease of {holder} lapsed; it asks no more")
                    replica = self._route(prompt_tokens, kv_tokens)
                    if replica is not None:
                        return self._grant(replica, doc_id, prompt_tokens, kv_tokens, stage, holder)
                    await self._cond.wait()
        except TimeoutError:
            raise TimeoutError(
                f"no batch seat for {doc_id} within {timeout_s} s; caps: {self._caps()}"
            ) from None
        finally:
            self._waiting -= 1

    async def release(
        self, permit_id: str, record_row: dict | None = None, gaps: list[dict] | None = None
    ) -> bool:
        """Free a seat and feed the request's timings (its record row and token-gap rows with
        `t`, `gap_s`) to the streamed sensor. Releasing an unknown or already released permit is a
        no-op returning False, so retried releases are harmless."""
        await self._start()
        for r in self.replicas.values():
            held = r.held.pop(permit_id, None)
            if held is not None:
                break
        else:
            return False
        if self.journal is not None:
            self.journal.released(permit_id, record_row)
        self._counts["released"] += 1
        if record_row is not None:
            self._counts["failed"] += record_row.get("status", "ok") != "ok"
            self._feed(record_row, gaps)
        async with self._cond:
            self._cond.notify_all()
        return True

    async def progress(
        self, permit_id: str, prefilled_tokens: int, prompt_tokens: int | None = None
    ) -> None:
        """How far a permit's prompt is prefilled (e.g. all of it once its first token arrived),
        and its exact length when known (`acquire` got an estimate, made before the prompt was).
        Without it the Gate assumes none is, which overstates pending KV and prefill (the safe
        side: under the SLO policy a prompt never reported prefilled holds back the next one until
        it is released)."""
        for r in self.replicas.values():
            held = r.held.get(permit_id)
            if held is not None:
                held.prompt_tokens = prompt_tokens or held.prompt_tokens
                held.prefilled_tokens = min(prefilled_tokens, held.prompt_tokens)
                async with self._cond:
                    self._cond.notify_all()

    async def report(self, record_row: dict, gaps: list[dict] | None = None) -> None:
        """Timings of a request that held no permit (a chat request seen by a load generator or a
        gateway), so the controller sees exact chat ITL and TTFT."""
        self._feed(record_row, gaps)

    async def stop(self, reason: str, abort: bool = False) -> None:
        """Grant nothing more, now or later: waiting and future `acquire` calls raise RunStopped.
        Permits already granted finish normally, unless `abort`: then workers, which poll
        `aborted`, cancel their requests in flight (a deadline that must free the replica now)."""
        self._stopped = reason
        self._abort = self._abort or abort
        async with self._cond:
            self._cond.notify_all()

    async def settled_docs(self) -> list[str] | None:
        """Once stopped with no seat held: every document ever granted a seat (none will be
        now). The rest of the night's documents can only end `stopped`, so a driver that has the
        outcomes of these has the night's last news. None until then."""
        if self._stopped is None or any(r.held for r in self.replicas.values()):
            return None
        return sorted(self._granted_docs)

    async def aborted(self) -> bool:
        """Whether requests in flight should be cancelled (see `stop`)."""
        return self._abort

    async def heartbeat(self, holder: str) -> bool:
        """`aborted`, from a worker that holds seats on a lease: renews its lease."""
        self.leases.renew(holder, time.monotonic())
        return self._abort

    async def mark_down(self, replica: str) -> None:
        """A replica died: grant nothing more there until the sensor sees it answer again (a
        replica restarted under its URL rejoins the night). Its permits stay until released."""
        await self._start()
        if replica not in self.replicas:
            raise ValueError(f"unknown replica {replica!r}; this Gate has {sorted(self.replicas)}")
        self.replicas[replica].up = False
        self.replicas[replica].down_at = time.time()
        log.warning("replica %s marked down; no more permits there", replica)
        async with self._cond:
            self._cond.notify_all()

    # -- views ------------------------------------------------------------------------------

    async def caps(self) -> dict[str, dict]:
        """Current caps per replica."""
        await self._start()
        return self._caps()

    async def decision_rows(self) -> list[dict]:
        """Every decision so far (the run's decisions table gets them through the journal)."""
        return list(self._rows)

    async def engine_step_rows(self) -> list[dict]:
        """The engine plug-ins' status as read at every poll, as rows of the engine_steps table."""
        rows = self.plugin.step_rows if self.plugin is not None else []
        return [{"run_id": self.run_id, **row} for row in rows]

    async def metrics_text(self) -> bytes:
        """The Gate's series in Prometheus's text format: a run serves them on its own port."""
        return self.metrics.exposition()

    async def stats(self) -> dict:
        return {
            **self._counts,
            "waiting": self._waiting,
            "in_flight": {r.name: len(r.held) for r in self.replicas.values()},
            "down": [r.name for r in self.replicas.values() if not r.up],
            "decisions": len(self._rows),
            "metrics_port": self.metrics_port,
        }

    # -- control loop -----------------------------------------------------------------------

    async def poll_now(self) -> dict[str, dict]:
        """Force one control step now (the background loop takes one every `interval_s`) and
        return the caps it set."""
        if self._loop_task is None:
            await self._start()  # which takes the first step
        else:
            await self._poll()
        return self._caps()

    async def _poll(self) -> None:
        """One control step: take back lapsed seats, observe, decide per replica, record, wake
        waiters."""
        self._expire_leases()
        observations = await self._observe()
        for r in self.replicas.values():
            self._bring_back(r, observations.get(r.name))
            if r.up:
                self._apply(r, self._enrich(r, observations.get(r.name)))
                await self._send_control(r)
        if self.plugin is not None:
            for row in self.plugin.step_rows[self._steps_exported :]:
                self.metrics.record_steps(row)
                if self.journal is not None:
                    self.journal.recorded("engine_steps", {"run_id": self.run_id, **row})
            self._steps_exported = len(self.plugin.step_rows)
            for name, doc in self.plugin.latest.items():
                self.metrics.record_status(name, doc)
        self._counts["polls"] += 1
        async with self._cond:
            self._cond.notify_all()

    async def close(self) -> None:
        """Stop polling and exporting; in-flight permits are simply forgotten."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self.metrics.close()
        if self.journal is not None:
            self.journal.close()
        close = getattr(self.sensor, "aclose", None)
        if close is not None:
            await close()

    async def _start(self) -> None:
        """First call: take one decision before anything is granted, then poll in the background."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
            await self._poll()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._poll()
            except Exception:  # a bad poll must not end control; the next one may succeed
                log.exception("gate poll failed")

    async def _observe(self) -> dict[str, Observation]:
        """Whatever the sensor saw; a failing or hanging sensor yields nothing, so every replica
        is observed as stale and paused."""
        try:
            return await asyncio.wait_for(self.sensor.observe(), timeout=max(self.interval_s, 1.0))
        except Exception as exc:
            self._counts["sensor_errors"] += 1
            log.warning("sensor failed (%s); pausing batch until it answers", exc)
            return {}

    def _bring_back(self, r: _Replica, obs: Observation | None) -> None:
        """A replica marked down that the sensor read afresh since is serving again."""
        if not r.up and obs is not None and obs.fresh and obs.t > r.down_at:
            r.up = True
            log.warning("replica %s answers again; permits resume there", r.name)

    def _enrich(self, r: _Replica, obs: Observation | None) -> Observation:
        """Add what only the Gate knows: the batch it admitted. Engine sensors count all running
        requests; the ones we admitted are batch, the rest chat, and all of them decode."""
        if obs is None:
            return Observation(t=time.time(), replica=r.name, fresh=False)
        batch = tuple(
            BatchInFlight(h.prompt_tokens, h.prefilled_tokens, h.output_tokens)
            for h in r.held.values()
        )
        decoding_batch = [b for b in batch if b.prefill_remaining == 0]
        chat = obs.chat_decoding or max(0, obs.running - len(decoding_batch))
        context = obs.chat_decode_context_tokens
        if not context and obs.kv_usage is not None and obs.kv_capacity_tokens:
            batch_kv = sum(b.prompt_tokens for b in decoding_batch)
            context = max(0, int(obs.kv_usage * obs.kv_capacity_tokens) - batch_kv)
        return replace(
            obs,
            batch_in_flight=obs.batch_in_flight or batch,
            chat_decoding=chat,
            chat_decode_context_tokens=context,
        )

    def _apply(self, r: _Replica, obs: Observation) -> None:
        decision = self.policy.decide(obs)
        changed = r.decision is None or (
            (r.decision.batch_seats, r.decision.batch_step_target_ms, r.decision.pause)
            != (decision.batch_seats, decision.batch_step_target_ms, decision.pause)
        )
        r.decision, r.observation = decision, obs
        r.granted_kv_tokens = 0
        row = _row(self.run_id, obs, decision)
        self._rows.append(row)
        if self.journal is not None:
            self.journal.recorded("decisions", row)
        self.metrics.record(obs, decision, len(r.held))
        level = logging.INFO if changed else logging.DEBUG
        log.log(level, "%s: %s in_flight=%d", r.name, decision, len(r.held))

    async def _send_control(self, r: _Replica) -> None:
        """The decision's step target (or pause) to the replica's engine plug-in, if it steers."""
        target, d = self.control.get(r.name), r.decision
        if target is None or d is None or self.model is None:
            return
        if d.batch_step_target_ms is None and not d.pause:
            return
        r.control_seq = engine_control.next_seq(r.control_seq)
        ttl = max(MIN_CONTROL_TTL_S, CONTROL_TTL_POLLS * self.interval_s)
        doc = engine_control.decision_document(
            r.control_seq, d.batch_step_target_ms or 0.0, self.model, ttl, d.pause,
            idle_target_ms=d.idle_step_target_ms, mean_target_ms=d.mean_step_target_ms,
            chat_cache_horizon_s=d.chat_cache_horizon_s, tail_scale=d.tail_scale,
        )  # fmt: skip
        try:
            await asyncio.to_thread(engine_control.send, target, doc)
        except ControlError as exc:
            self._counts["control_errors"] += 1
            log.warning("%s: control document not delivered (%s)", r.name, exc)

    def _expire_leases(self) -> None:
        """Release the seats of every holder whose lease lapsed: its worker died holding them."""
        for holder in self.leases.expired(time.monotonic()):
            for r in self.replicas.values():
                lapsed = [pid for pid, h in r.held.items() if h.holder == holder]
                for permit_id in lapsed:
                    del r.held[permit_id]
                    if self.journal is not None:
                        self.journal.released(permit_id, None, WORKER_DIED_IN_FLIGHT)
                self._counts["expired"] += len(lapsed)
                if lapsed:
                    log.warning(
                        "worker %s unheard of for %.0f s: its %d seat(s) on %s released",
                        holder, self.leases.lease_s, len(lapsed), r.name,
                    )  # fmt: skip

    # -- routing ----------------------------------------------------------------------------

    def _route(self, prompt_tokens: int, kv_tokens: int) -> _Replica | None:
        """The open replica with the most free seats, then the lowest KV usage."""
        now = time.time()
        open_ = [
            r for r in self.replicas.values() if self._can_take(r, prompt_tokens, kv_tokens, now)
        ]
        if not open_:
            return None
        return max(open_, key=lambda r: (r.free_seats(), -(r.observation.kv_usage or 0.0)))

    def _can_take(self, r: _Replica, prompt_tokens: int, kv_tokens: int, now: float) -> bool:
        """Whether `r` may take a request now: up, a decision that admits, a free seat, and KV
        room for the whole request (prompt and output) beside what was granted since the
        decision, so an admitted document is never preempted."""
        d, obs = r.decision, r.observation
        if not r.up or d is None or obs is None or d.pause or r.free_seats() <= 0:
            return False
        room = d.kv_room_tokens
        return room is None or r.granted_kv_tokens + kv_tokens <= room

    def _check_can_ever_fit(self, kv_tokens: int) -> None:
        """Fail at once, not wait forever, for a request no replica could hold; fail once every
        replica has been down for `down_grace_s` (until then the request waits, so a night on one
        replica rides out its restart)."""
        up = [r for r in self.replicas.values() if r.up]
        if not up:
            down_for = time.time() - max(r.down_at for r in self.replicas.values())
            if down_for >= self.config.down_grace_s:
                raise RuntimeError(
                    f"every replica has been marked down for {down_for:.0f} s (down_grace_s "
                    f"{self.config.down_grace_s:g}); no batch seat can be granted"
                )
            return
        if not self.kv_guarded:
            return
        high_water = self.kv_high_water
        caps = [r.observation.kv_capacity_tokens for r in up if r.observation]
        if caps and all(c and kv_tokens > c * high_water for c in caps):
            raise ValueError(
                f"a request of {kv_tokens} KV tokens exceeds every replica's KV high-water mark "
                f"({high_water} of {max(caps)} tokens); summarize it in sections (job mode "
                "map_reduce, or a smaller section_tokens)"
            )

    def _grant(
        self,
        r: _Replica,
        doc_id: str,
        prompt_tokens: int,
        kv_tokens: int,
        stage: str | None,
        holder: str | None,
    ) -> Permit:
        permit = Permit(
            permit_id=f"{self.run_id}-{next(self._ids)}",
            replica=r.name,
            base_url=r.base_url,
            chunk_tokens=r.decision.chunk_tokens,
            priority=BATCH_PRIORITY,
            granted_at=time.time(),
        )
        r.held[permit.permit_id] = _Held(
            permit, prompt_tokens, 0, kv_tokens - prompt_tokens, holder
        )
        r.granted_kv_tokens += kv_tokens
        self._counts["granted"] += 1
        self._granted_docs.add(doc_id)
        if self.journal is not None:
            self.journal.granted(
                permit.permit_id, doc_id, stage, r.name, prompt_tokens, permit.granted_at
            )
        log.debug("granted %s on %s for %s", permit.permit_id, r.name, doc_id)
        return permit

    def _feed(self, row: dict, gaps: list[dict] | None) -> None:
        replica, cls = row.get("replica"), row.get("class", "batch")
        if replica is None:
            return
        if gaps:
            self.streamed.feed_gaps(replica, cls, ((g["t"], g["gap_s"]) for g in gaps))
        if row.get("ttft_s") is not None and row.get("t_first_token") is not None:
            self.streamed.feed_ttft(replica, cls, row["t_first_token"], row["ttft_s"])

    def _caps(self) -> dict[str, dict]:
        return {
            r.name: {
                "batch_seats": r.decision.batch_seats if r.decision else 0,
                "chunk_tokens": r.decision.chunk_tokens if r.decision else 0,
                "pause": True if not r.up or r.decision is None else r.decision.pause,
                "reason": "down" if not r.up else (r.decision.reason if r.decision else "none"),
                "in_flight": len(r.held),
                "batch_step_target_ms": r.decision.batch_step_target_ms if r.decision else None,
                "kv_room_tokens": r.decision.kv_room_tokens if r.decision else None,
            }
            for r in self.replicas.values()
        }


def _row(run_id: str, obs: Observation, d: Decision) -> dict:
    return {
        "run_id": run_id,
        "t": obs.t,
        "replica": obs.replica,
        "batch_seats": d.batch_seats,
        "chunk_tokens": d.chunk_tokens,
        "pause": d.pause,
        "observed_itl_p99_s": obs.chat_itl_p99_s,
        "observed_ttft_p99_s": obs.chat_ttft_p99_s,
        "observed_kv_usage": obs.kv_usage,
        "predicted_step_ms": d.predicted_step_ms,
        "reason": d.reason,
        "prefill_budget_tokens": d.prefill_budget_tokens,
        "batch_step_target_ms": d.batch_step_target_ms,
        "kv_room_tokens": d.kv_room_tokens,
        "observed_target_bound_share": obs.target_bound_share,
        "observed_chat_cache_tokens": obs.chat_cache_tokens,
        "slack_mark": d.slack_mark,
        "mean_step_target_ms": d.mean_step_target_ms,
    }


Gate = ray.remote(GateActor)
"""The Ray actor. Create it with `start_gate`, or `Gate.options(name=gate_name(run_id), ...)`."""


def gate_name(run_id: str) -> str:
    """The Gate's actor name: workers find it with `ray.get_actor(gate_name(run_id))`."""
    return f"nightshift-gate-{run_id}"


def start_gate(
    run_id: str,
    replicas: Iterable[tuple[str, str]],
    lifetime: str | None = None,
    config: GateConfig | None = None,
    **settings,
):
    """Create the run's Gate, or join it if it already exists. Its settings (`config`, or
    `GateConfig`'s fields as keywords) are checked here first, so a typo fails in the caller
    with its message rather than later inside the actor."""
    if config is not None and settings:
        raise ValueError(f"give a GateConfig or its settings, not both ({', '.join(settings)})")
    config = config or GateConfig(**settings)
    config.check()
    options: dict[str, Any] = {}
    if config.journal is not None:
        # The journal is a file of the driver's run folder: the Gate must run on the driver's node.
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    # Workers call the Gate several times per document (acquire, heartbeats, progress, release),
    # and Ray's GCS keeps a record of every call until its task-event cap: over a night of
    # thousands of documents that is the GCS growing for records nothing reads.
    options["enable_task_events"] = False
    return Gate.options(
        name=gate_name(run_id), get_if_exists=True, lifetime=lifetime, **options
    ).remote(run_id, list(replicas), config)
