"""One `nightshift chat-load` run: its settings checked, its replicas found or started, played.

Sizes are given at production scale and multiplied by `scale` (by default 0.1 on a CPU engine, 1
on GPUs), so the same command line describes the product whatever the engine. Without replica
URLs one replica is started from the engine config on loopback, on the first free port from
`serving.paths.DEFAULT_PORT`, and stopped at the end. The first Ctrl-C ends a run gracefully
(records kept); a second one interrupts it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.chat_load import ChatLoadSpec, run_chat_load
from bench.chat_prompts import TemplateCost, check_fits
from bench.chat_results import ChatLoadResult
from bench.chat_sessions import ChatShape, plan_stats
from bench.serving_metrics import parse_goodput
from serving.engine_config import EngineConfig
from simulator.trace import covering_s, read_trace, scale_trace

DEFAULT_DURATION_S = 60.0
"""Seconds of Poisson arrivals when no duration is given; a replayed trace runs to its last one."""
CPU_SCALE = 0.1
"""Default scale on a CPU engine: a 6k-token system prompt becomes 600 tokens."""

Say = Callable[[str], None]


class ChatLoadInputError(ValueError):
    """Bad input to a chat load run; the message names the option and the fix."""


@dataclass(frozen=True)
class ChatLoadOptions:
    """A chat load run as the command line gives it; sizes at production scale."""

    rate: float | None = None
    duration: float | None = None
    """Seconds of arrivals; None: the whole trace when one is replayed, else `DEFAULT_DURATION_S`."""
    trace: Path | None = None
    trace_speedup: float | None = None
    trace_start: float = 0.0
    shape: ChatShape = ChatShape()
    scale: float | None = None
    seed: int = 0
    grace: float = 10.0
    max_requests: int | None = None
    routing: str = "least-outstanding"
    goodput: tuple[str, ...] = ()
    """vLLM's `--goodput` items, `ttft:MS`, `tpot:MS`, `e2el:MS`."""


def load_spec(config: EngineConfig, opts: ChatLoadOptions) -> ChatLoadSpec:
    """The run's spec: sizes scaled for the engine, the trace read, and a check (before any
    replica starts) that a turn fits the engine's context; raises ValueError naming the option."""
    factor = opts.scale if opts.scale is not None else (
        CPU_SCALE if config.hardware.kind == "cpu" else 1.0
    )  # fmt: skip
    shape = opts.shape.scaled(factor)
    rows = None
    if opts.trace is not None:
        rows = tuple(
            scale_trace(
                read_trace(opts.trace),
                speedup=opts.trace_speedup,
                rate=opts.rate,
                token_scale=factor,
                start_s=opts.trace_start,
            )  # fmt: skip
        )
    elif opts.rate is None:
        raise ChatLoadInputError("give --rate (requests/s) or --trace CSV")
    elif opts.trace_speedup is not None:
        raise ChatLoadInputError("--trace-speedup needs --trace")
    limit = config.flag("max-model-len")
    spec = ChatLoadSpec(
        shape=shape,
        rate=opts.rate if opts.rate is not None else 1.0,
        duration_s=_duration_s(opts.duration, rows),
        trace=rows,
        seed=opts.seed,
        grace_s=opts.grace,
        max_requests=opts.max_requests,
        routing=opts.routing,
        context_limit=int(limit) if limit is not None else None,
        goodput_slos=tuple(parse_goodput(opts.goodput).items()),
    )
    # The exact check, with the served tokenizer, comes when the prompts are built.
    check_fits(spec.shape, TemplateCost(), spec.context_limit)
    return spec


def _duration_s(given: float | None, rows: tuple | None) -> float:
    if given is not None:
        return given
    return covering_s(rows) if rows else DEFAULT_DURATION_S


def short_trace_warning(spec: ChatLoadSpec) -> str | None:
    """A trace's ContextTokens include its own system prompt; when ours is longer than most of
    them, replayed prompts are little more than a cut system prompt, which is rarely intended."""
    if not spec.trace:
        return None
    system = spec.shape.system_prompt_tokens
    short = sum(r.context_tokens <= system for r in spec.trace) / len(spec.trace)
    if short <= 0.5:
        return None
    return (
        f"{short:.0%} of the trace's prompts are no longer than the {system}-token system prompt "
        "and will carry only part of it; lower --system-prompt-tokens to leave room for context "
        "and history"
    )


def check_url(url: str) -> str:
    """A replica's base URL without its trailing slash, or an error showing the form."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ChatLoadInputError(
            f"--replica-url {url!r} is not a base URL; write it like http://127.0.0.1:8000"
        )
    return url.rstrip("/")


def run_id_for(run_id: str | None, out: Path | None) -> str:
    """The run id given, else the run directory's name, else `chat-<time>`; checked."""
    from warehouse.run_files import RunFilesError, check_run_id

    name = run_id or (out.resolve().name if out else time.strftime("chat-%Y%m%d-%H%M%S"))
    try:
        return check_run_id(name)
    except RunFilesError as exc:
        raise ChatLoadInputError(f"{exc} (set --run-id)") from None


def check_healthy(urls: list[str]) -> None:
    """Fail before the run rather than record a run of connection errors."""
    import httpx

    for url in urls:
        try:
            healthy = httpx.get(f"{url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if not healthy:
            raise ChatLoadInputError(
                f"no healthy replica answers {url}/health; start one with `nightshift engine "
                "up --engine-config CONFIG` or leave out --replica-url to start one for this run"
            )


def run_chat_load_on(
    config: EngineConfig,
    config_path: Path,
    spec: ChatLoadSpec,
    urls: list[str],
    port: int | None,
    run_id: str,
    say: Say,
    out: Path | None = None,
) -> ChatLoadResult:
    """Play `spec` against the replicas at `urls`, or against one started here for the run;
    with `out`, records go to that run directory as they end (`bench.chat_spool`). Raises
    EngineStartError or SetupError when a replica cannot be started."""
    from serving.launcher import ReplicaSet, free_port

    if urls:
        check_healthy(urls)
        return _play(config, [(urlsplit(u).netloc, u) for u in urls], spec, run_id, say, out)
    with ReplicaSet().running(config, str(config_path), port or free_port()) as started:
        say(f"started {started[0].name} at {started[0].base_url}")
        return _play(config, [(r.name, r.base_url) for r in started], spec, run_id, say, out)


def _play(
    config: EngineConfig,
    replicas: list[tuple[str, str]],
    spec: ChatLoadSpec,
    run_id: str,
    say: Say,
    out: Path | None,
) -> ChatLoadResult:
    from bench.chat_spool import RecordSpool
    from serving.tokenizer import tokenizer_for

    tokenizer = tokenizer_for(config, replicas[0][1])
    stats = plan_stats(spec.plans())
    say(
        f"plan: {stats['requests']} requests in {stats['sessions']} sessions over "
        f"{spec.duration_s:g} s; Ctrl-C ends it early"
    )

    async def main() -> ChatLoadResult:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, _once(loop, stop, say))
        try:
            return await run_chat_load(
                replicas, config.model.served_name, tokenizer, spec, run_id, stop,
                spool=RecordSpool(out, run_id) if out is not None else None,
            )  # fmt: skip
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


def _once(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, say: Say):
    def handler() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        say("stopping: waiting for requests in flight (Ctrl-C again to abort)")

    return handler
