"""Production-shaped chat load against running replicas: one awaitable, records per docs/design.md §4.5.

`run_chat_load` plays a plan from `bench.chat_sessions` in real time: each turn waits for its planned
arrival and for its session's previous answer (a user cannot ask the next question before reading
the answer), then streams through `serving.client.StreamingClient` at chat priority with `ignore_eos`
(the local models have random weights, so without it answers would end at random and the planned
output lengths would mean nothing). It is a plain coroutine: the benchmark runs it beside the batch
pipeline in one event loop and ends it with an `asyncio.Event`.

The run stops taking arrivals at `duration_s`, after `max_requests`, or when `stop` is set; requests
still streaming then get `grace_s` to finish and are cancelled after it (recorded as `cancelled`),
and turns still waiting for their predecessor are not sent at all (counted as `not_sent`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chat_prompts import HistoryTurn, PromptBuilder, TemplateCost, TextPool
from bench.chat_results import ChatLoadResult, SentTurn, default_goodput_slos
from bench.chat_sessions import Arrival, ChatShape, TurnPlan, plan_turns, poisson_arrivals
from bench.chat_spool import RecordSpool
from bench.chat_tally import ChatTally
from bench.frozen_heap import frozen_heap
from scheduler.records import RequestRecord
from serving.client import ClientConfig, StreamingClient
from simulator.trace import TraceRow

ROUTING = ("least-outstanding", "round-robin", "session")
"""How a turn picks its replica: fewest requests in flight, strict rotation, or the replica its
session started on (best prefix-cache reuse of the history)."""


@dataclass(frozen=True)
class ChatLoadSpec:
    """One chat load run. Sizes in `shape` and `trace` are used as given: scale them beforehand."""

    shape: ChatShape = field(default_factory=ChatShape)
    """What a turn looks like."""
    rate: float = 1.0
    """Poisson arrivals per second; ignored when `trace` is set."""
    duration_s: float = 60.0
    """Arrivals stop after this many seconds."""
    trace: tuple[TraceRow, ...] | None = None
    """Replay these arrivals and sizes instead of Poisson arrivals."""
    seed: int = 0
    """Seed of arrivals and content: the same seed plans the same run."""
    grace_s: float = 10.0
    """Time requests still streaming at the end get before they are cancelled."""
    max_requests: int | None = None
    """Stop after this many arrivals, whatever the duration."""
    context_limit: int | None = None
    """The engine's max-model-len: older history drops out so prompt plus answer fit."""
    routing: str = "least-outstanding"
    """Replica choice per turn, one of ROUTING."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """Timeouts and retries of the streaming client."""
    goodput_slos: tuple[tuple[str, float], ...] = ()
    """Per-request SLOs (ms) that `goodput` counts requests against, as vLLM's `--goodput`
    (`ttft`, `tpot`, `e2el`); empty: the default SLO's targets."""

    def __post_init__(self) -> None:
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration must be positive seconds, got {self.duration_s}")
        if self.grace_s < 0:
            raise ValueError(f"grace must be 0 or more seconds, got {self.grace_s}")
        if self.trace is None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be positive requests/s, got {self.rate}")
        if self.routing not in ROUTING:
            raise ValueError(f"routing {self.routing!r}: choose one of {', '.join(ROUTING)}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {self.max_requests}")

    def plans(self) -> list[TurnPlan]:
        """Every turn this run may send, in arrival order."""
        if self.trace is not None:
            arrivals = [
                Arrival(r.t_s, r.context_tokens, r.generated_tokens)
                for r in self.trace
                if r.t_s < self.duration_s
            ]
        else:
            arrivals = poisson_arrivals(self.rate, self.duration_s, self.seed)
        return plan_turns(arrivals[: self.max_requests], self.shape, self.seed)


class Router:
    """Picks a replica per turn and tracks what each has in flight."""

    def __init__(self, names: list[str], policy: str = "least-outstanding") -> None:
        if not names:
            raise ValueError("no replicas to send chat to; give at least one replica URL")
        self.names, self.policy = names, policy
        self.outstanding = dict.fromkeys(names, 0)
        self._picks = dict.fromkeys(names, 0)
        self._rotation = itertools.cycle(names)
        self._home: dict[int, str] = {}

    def pick(self, session: int) -> str:
        if self.policy == "round-robin":
            name = next(self._rotation)
        elif self.policy == "session" and session in self._home:
            name = self._home[session]
        else:  # ties go to the replica picked least, so an idle set is filled evenly
            name = min(self.names, key=lambda n: (self.outstanding[n], self._picks[n]))
        self._home.setdefault(session, name)
        self.outstanding[name] += 1
        self._picks[name] += 1
        return name

    def release(self, name: str) -> None:
        self.outstanding[name] -= 1


def model_text() -> str:
    """The text prompts are cut from: every `serving/model_text/*.txt`, in name order."""
    from serving.local_models import TEXT_DIR

    files = sorted(Path(TEXT_DIR).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no *.txt under {TEXT_DIR}; the chat load cuts prompts from them")
    return "\n\n".join(f.read_text() for f in files)


def prepare(
    spec: ChatLoadSpec, tokenizer, text: str | None = None
) -> tuple[PromptBuilder, list[TurnPlan]]:
    """Tokenize the source text once (every prompt is cut from it by token, so its size is known
    without encoding it) and plan the run."""
    pool = TextPool.from_text(text if text is not None else model_text(), tokenizer)
    builder = PromptBuilder(spec.shape, pool, TemplateCost.llama3(tokenizer), spec.context_limit)
    return builder, spec.plans()


async def run_chat_load(
    replicas: list[tuple[str, str]],
    model: str,
    tokenizer,
    spec: ChatLoadSpec,
    run_id: str,
    stop: asyncio.Event | None = None,
    *,
    text: str | None = None,
    http=None,
    on_record: Callable[[RequestRecord], None] | None = None,
    spool: RecordSpool | None = None,
) -> ChatLoadResult:
    """Play `spec` against `replicas` (name, base URL) serving `model`. `text` replaces the
    source text and `http` the HTTP client (tests). The tokenizer runs in a worker thread, so a
    replica's `/tokenize` endpoint does not stall the event loop. `on_record` sees every finished
    request as it ends (a Gate uses it for exact chat latency while the load runs).

    With `spool`, every record goes to its run directory as it ends and the result holds none
    (`records`, `gaps` and `turns` empty): memory then grows by a few bytes per token, not by
    the run's records, however long it runs. Without it the result holds them all."""
    builder, plans = await asyncio.to_thread(prepare, spec, tokenizer, text)
    clients = {
        name: StreamingClient(
            url, model, run_id=run_id, replica=name, config=spec.client, http=http
        )
        for name, url in replicas
    }
    router = Router([n for n, _ in replicas], spec.routing)
    tally = ChatTally(dict(spec.goodput_slos) or default_goodput_slos())
    run = _Run(spec, builder, clients, router, run_id, tokenizer, tally, on_record, spool)
    started = time.time()
    try:
        with frozen_heap():  # a full collection of the process must not stall the stamps
            await run.play(plans, stop)
    finally:
        for client in clients.values():
            await client.aclose()
        if spool is not None:
            spool.flush()
    records = [t.record for t in run.sent]
    summary = tally.summary(window_s=run.window_s, not_sent=run.not_sent, planned=len(plans))
    summary.update(run_id=run_id, replicas=[n for n, _ in replicas])
    gaps = [g for r in records for g in r.gaps]
    return ChatLoadResult(
        run_id, records, gaps, summary, run.sent, started, time.time(),
        spooled=spool.written if spool else 0, first_error=tally.first_error,
    )  # fmt: skip


@dataclass
class _Session:
    history: list[HistoryTurn] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: turns go in order


class _Run:
    """The live state of one run: sessions, requests in flight, what was sent."""

    def __init__(
        self,
        spec: ChatLoadSpec,
        builder: PromptBuilder,
        clients: dict[str, StreamingClient],
        router: Router,
        run_id: str,
        tokenizer,
        tally: ChatTally,
        on_record: Callable[[RequestRecord], None] | None = None,
        spool: RecordSpool | None = None,
    ) -> None:
        self.spec, self.builder, self.clients, self.router = spec, builder, clients, router
        self.run_id, self.tokenizer, self.on_record = run_id, tokenizer, on_record
        self.tally, self.spool = tally, spool
        self.sessions: dict[int, _Session] = {}
        self._last_turn: dict[int, int] = {}
        self.tasks: set[asyncio.Task] = set()
        self.sent: list[SentTurn] = []
        self.not_sent = 0
        self.closed = False  # once set, turns not yet submitted are dropped
        self.window_s = 0.0
        self.stopped = asyncio.Event()

    async def play(self, plans: list[TurnPlan], stop: asyncio.Event | None) -> None:
        for plan in plans:  # a session's history is dropped once its last planned turn ends
            self._last_turn[plan.session] = max(plan.turn, self._last_turn.get(plan.session, 0))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = loop.call_at(t0 + self.spec.duration_s, self.stopped.set)
        forward = asyncio.create_task(_forward(stop, self.stopped)) if stop else None
        if stop is not None and stop.is_set():
            self.stopped.set()
        try:
            played_all = await self._arrivals(plans, t0)
            # A plan that ran out covers the whole duration, unless max_requests cut it short.
            cut = self.spec.max_requests is not None and len(plans) >= self.spec.max_requests
            elapsed = min(loop.time() - t0, self.spec.duration_s)
            self.window_s = self.spec.duration_s if played_all and not cut else elapsed
            await self._wait(self.tasks, until_stopped=True)
            self.closed = True
            await self._wait(self.tasks, timeout=self.spec.grace_s)
        finally:
            self.closed = True
            deadline.cancel()
            if forward:
                forward.cancel()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _arrivals(self, plans: list[TurnPlan], t0: float) -> bool:
        """Submit each turn at its time; False when the run was stopped before the last."""
        loop = asyncio.get_running_loop()
        for plan in plans:
            delay = t0 + plan.t_s - loop.time()
            if self.stopped.is_set() or (delay > 0 and await _stopped_within(self.stopped, delay)):
                return False
            task = asyncio.create_task(self._turn(plan))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return True

    async def _wait(
        self, tasks: set[asyncio.Task], *, until_stopped: bool = False, timeout: float | None = None
    ) -> None:
        """Until `tasks` are done, or the run is stopped (`until_stopped`), or `timeout` passes."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        stopper = asyncio.create_task(self.stopped.wait())
        try:
            while tasks and not (until_stopped and self.stopped.is_set()):
                left = None if end is None else end - loop.time()
                if left is not None and left <= 0:
                    return
                watch = set(tasks) | ({stopper} if until_stopped else set())
                await asyncio.wait(watch, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()

    async def _turn(self, plan: TurnPlan) -> None:
        session = self.sessions.setdefault(plan.session, _Session())
        submitted = False
        try:
            async with session.lock:
                if self.closed:
                    self.not_sent += 1
                    return
                submitted = True
                await self._send(plan, session)
        except asyncio.CancelledError:
            if not submitted:
                self.not_sent += 1
            raise
        finally:
            if self._last_turn.get(plan.session, plan.turn) <= plan.turn:
                self.sessions.pop(plan.session, None)  # no later turn reads its history

    async def _send(self, plan: TurnPlan, session: _Session) -> None:
        prompt = self.builder.build(plan, session.history)
        replica = self.router.pick(plan.session)
        request_id = f"chat-{plan.index:06d}-s{plan.session}-t{plan.turn}"
        t_submit = time.time()
        record = None
        try:
            done = await self.clients[replica].chat(
                prompt.messages,
                max_tokens=plan.output_tokens,
                cls="chat",
                stage="chat",
                ignore_eos=True,
                request_id=request_id,
            )
            record = done.record
            if done.ok:  # counted as re-sent: text can tokenize unlike the ids the engine sampled
                answer = done.text
                tokens = len(await asyncio.to_thread(self.tokenizer.encode, answer))
            else:  # the user saw an error; the conversation goes on without its answer
                answer, tokens = self.builder.stand_in_answer(plan), plan.output_tokens
            keep = self.spec.shape.history_keeps_context
            session.history.append(prompt.history_turn(answer, tokens, keep))
        except asyncio.CancelledError:
            if record is None:  # else the answer was complete; only its bookkeeping was cut
                record = _cancelled(self.run_id, request_id, replica, t_submit, self.spec.grace_s)
            raise
        finally:
            self.router.release(replica)
            if record is not None:
                self._record(SentTurn(plan, prompt.tokens, prompt.history_turns, record))

    def _record(self, turn: SentTurn) -> None:
        self.tally.add(turn.record, turn.plan.session, turn.planned_prompt_tokens)
        if self.spool is not None:
            self.spool.add(turn.record)
        else:
            self.sent.append(turn)
        if self.on_record is not None:
            self.on_record(turn.record)


async def _forward(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _stopped_within(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _cancelled(
    run_id: str, request_id: str, replica: str, t_submit: float, grace_s: float
) -> RequestRecord:
    record = RequestRecord(run_id, request_id, "chat", "chat", replica, t_submit=t_submit)
    record.finish([], time.time())
    record.status = "cancelled"
    record.error = f"still streaming {grace_s:g} s after the run stopped taking arrivals"
    return record
