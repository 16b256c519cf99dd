"""`nightshift chat-load`: production-shaped chat traffic against replicas, alone.

Sizes are given at production scale and multiplied by `--scale` (by default 0.1 on a CPU engine,
1 on GPUs), so the same command line describes the product whatever the engine. Without
`--replica-url` a replica is started from the engine config on loopback and stopped at the end.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn
from urllib.parse import urlsplit

import typer

if TYPE_CHECKING:
    from bench.chat_load import ChatLoadSpec
    from bench.chat_results import ChatLoadResult
    from serving.engine_config import EngineConfig

CPU_SCALE = 0.1
"""Default --scale on a CPU engine: a 6k-token system prompt becomes 600 tokens."""


class ChatLoadInputError(ValueError):
    """Bad command-line input; the message names the option and the fix."""


def register(app: typer.Typer) -> None:
    app.command("chat-load")(chat_load_command)


def chat_load_command(
    engine_config: Annotated[Path, typer.Option(help="Engine config YAML of the replicas.")],
    rate: Annotated[
        float | None,
        typer.Option(
            help="Chat requests per second (Poisson); with --trace, the trace's mean "
            "rate is rescaled to this."
        ),
    ] = None,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals.")] = 60.0,
    replica_url: Annotated[
        list[str] | None,
        typer.Option(help="Base URL of a running replica (repeatable); none: start one."),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Replay a TIMESTAMP,ContextTokens,GeneratedTokens CSV.")
    ] = None,
    trace_speedup: Annotated[
        float | None, typer.Option(help="Replay the trace this many times faster.")
    ] = None,
    trace_start: Annotated[float, typer.Option(help="Skip this many seconds of the trace.")] = 0.0,
    system_prompt_tokens: Annotated[int, typer.Option(help="Shared system prompt.")] = 6000,
    retrieved_chunks: Annotated[int, typer.Option(help="Retrieved chunks per turn.")] = 4,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per retrieved chunk.")] = 500,
    turns: Annotated[float, typer.Option(help="Mean turns per session.")] = 4.0,
    think_time: Annotated[
        float, typer.Option(help="Mean seconds between a session's turns.")
    ] = 20.0,
    output_tokens: Annotated[int, typer.Option(help="Median answer length.")] = 200,
    max_tokens: Annotated[int, typer.Option(help="Longest answer.")] = 1024,
    scale: Annotated[
        float | None,
        typer.Option(help="Multiply every token size (default 0.1 on CPU engines, else 1)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of arrivals and content.")] = 0,
    grace: Annotated[float, typer.Option(help="Seconds in-flight requests get at the end.")] = 10.0,
    max_requests: Annotated[int | None, typer.Option(help="Stop after this many arrivals.")] = None,
    routing: Annotated[
        str, typer.Option(help="least-outstanding, round-robin or session.")
    ] = "least-outstanding",
    port: Annotated[
        int | None, typer.Option(help="Port of a started replica (default: first free from 8000).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the run directory (Parquet + run.json) here.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option(help="Run id (default: the --out folder name, or chat-<time>).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON here.")
    ] = None,
) -> None:
    """Play production-shaped chat sessions against replicas and summarize TTFT, ITL and E2E."""
    from bench.chat_prompts import TemplateCost, check_fits
    from bench.chat_sessions import ChatShape, ShapeError
    from bench.trace import TraceError
    from serving.engine_config import EngineConfigError, load_engine_config

    try:
        config = load_engine_config(engine_config)
        factor = (
            scale if scale is not None else (CPU_SCALE if config.hardware.kind == "cpu" else 1.0)
        )
        shape = ChatShape(
            system_prompt_tokens=system_prompt_tokens, retrieved_chunks=retrieved_chunks,
            chunk_tokens=chunk_tokens, turns=turns, think_time_s=think_time,
            output_tokens_median=output_tokens, max_tokens=max_tokens,
        ).scaled(factor)  # fmt: skip
        spec = _spec(
            config,
            shape,
            rate,
            duration,
            trace,
            trace_speedup,
            trace_start,
            factor,
            seed,
            grace,
            max_requests,
            routing,
        )
        # Before any replica starts; the exact check, with the served tokenizer, comes later.
        check_fits(spec.shape, TemplateCost(), spec.context_limit)
        urls = [_check_url(u) for u in replica_url or []]
        name = _run_id(run_id, out)
    except (EngineConfigError, ShapeError, TraceError, ChatLoadInputError, ValueError) as exc:
        _fail(str(exc))
    _warn_short_trace(spec)
    result = _run(config, engine_config, spec, urls, port, name)
    _report(result, config, out, json_out)


def _spec(
    config: EngineConfig,
    shape,
    rate,
    duration,
    trace,
    speedup,
    start,
    factor,
    seed,
    grace,
    max_requests,
    routing,
) -> ChatLoadSpec:
    from bench.chat_load import ChatLoadSpec
    from bench.trace import read_trace, scale_trace

    rows = None
    if trace is not None:
        rows = tuple(
            scale_trace(
                read_trace(trace), speedup=speedup, rate=rate, token_scale=factor, start_s=start
            )
        )
    elif rate is None:
        raise ChatLoadInputError("give --rate (requests/s) or --trace CSV")
    elif speedup is not None:
        raise ChatLoadInputError("--trace-speedup needs --trace")
    limit = config.flag("max-model-len")
    return ChatLoadSpec(
        shape=shape,
        rate=rate if rate is not None else 1.0,
        duration_s=duration,
        trace=rows,
        seed=seed,
        grace_s=grace,
        max_requests=max_requests,
        routing=routing,
        context_limit=int(limit) if limit is not None else None,
    )


def _warn_short_trace(spec: ChatLoadSpec) -> None:
    """A trace's ContextTokens include its own system prompt; when ours is longer than most of
    them, replayed prompts are little more than a cut system prompt, which is rarely intended."""
    if not spec.trace:
        return
    system = spec.shape.system_prompt_tokens
    short = sum(r.context_tokens <= system for r in spec.trace) / len(spec.trace)
    if short > 0.5:
        typer.secho(
            f"warning: {short:.0%} of the trace's prompts are no longer than the "
            f"{system}-token system prompt and will carry only part of it; lower "
            "--system-prompt-tokens to leave room for context and history",
            err=True,
            fg="yellow",
        )


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ChatLoadInputError(
            f"--replica-url {url!r} is not a base URL; write it like http://127.0.0.1:8000"
        )
    return url.rstrip("/")


def _run_id(run_id: str | None, out: Path | None) -> str:
    from warehouse.run_files import RunFilesError, check_run_id

    name = run_id or (out.resolve().name if out else time.strftime("chat-%Y%m%d-%H%M%S"))
    try:
        return check_run_id(name)
    except RunFilesError as exc:
        raise ChatLoadInputError(f"{exc} (set --run-id)") from None


def _run(
    config: EngineConfig,
    path: Path,
    spec: ChatLoadSpec,
    urls: list[str],
    port: int | None,
    run_id: str,
) -> ChatLoadResult:
    """Against the given replicas, or one started here for the length of the run."""
    from serving.launcher import EngineStartError, ReplicaSet
    from serving.paths import SetupError

    if urls:
        _check_healthy(urls)
        return _play(config, [(urlsplit(u).netloc, u) for u in urls], spec, run_id)
    try:
        with ReplicaSet().running(config, str(path), port or _free_port()) as started:
            typer.echo(f"started {started[0].name} at {started[0].base_url}", err=True)
            return _play(config, [(r.name, r.base_url) for r in started], spec, run_id)
    except (EngineStartError, SetupError) as exc:
        typer.secho(f"could not start a replica: {exc}", err=True, fg="red")
        raise typer.Exit(1) from None


def _check_healthy(urls: list[str]) -> None:
    """Fail before the run rather than record a run of connection errors."""
    import httpx

    for url in urls:
        try:
            healthy = httpx.get(f"{url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if not healthy:
            _fail(
                f"no healthy replica answers {url}/health; start one with `nightshift engine "
                "up CONFIG` or leave out --replica-url to start one for this run"
            )


def _play(
    config: EngineConfig, replicas: list[tuple[str, str]], spec: ChatLoadSpec, run_id: str
) -> ChatLoadResult:
    from bench.chat_sessions import ShapeError
    from serving.tokenizer import tokenizer_for

    try:
        tokenizer = tokenizer_for(config, replicas[0][1])
        return _play_with(config, replicas, spec, run_id, tokenizer)
    except (ShapeError, FileNotFoundError) as exc:
        _fail(str(exc))


def _play_with(
    config: EngineConfig,
    replicas: list[tuple[str, str]],
    spec: ChatLoadSpec,
    run_id: str,
    tokenizer,
) -> ChatLoadResult:
    from bench.chat_load import run_chat_load
    from bench.chat_sessions import plan_stats

    stats = plan_stats(spec.plans())
    typer.echo(
        f"plan: {stats['requests']} requests in {stats['sessions']} sessions over "
        f"{spec.duration_s:g} s; Ctrl-C ends it early",
        err=True,
    )

    async def main() -> ChatLoadResult:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # The first Ctrl-C ends the run gracefully (records kept); a second one interrupts.
        loop.add_signal_handler(signal.SIGINT, _once(loop, stop))
        try:
            return await run_chat_load(
                replicas, config.model.served_name, tokenizer, spec, run_id, stop
            )
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


def _once(loop: asyncio.AbstractEventLoop, stop: asyncio.Event):
    def handler() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        typer.echo("stopping: waiting for requests in flight (Ctrl-C again to abort)", err=True)

    return handler


def _free_port(first: int = 8000) -> int:
    from serving.launcher import port_in_use

    for candidate in range(first, first + 200):
        if not port_in_use("127.0.0.1", candidate):
            return candidate
    raise ChatLoadInputError(f"no free port in {first}..{first + 199}; choose one with --port")


def _report(
    result: ChatLoadResult, config: EngineConfig, out: Path | None, json_out: Path | None
) -> None:
    from bench.chat_results import write_run

    if out is not None:
        write_run(
            out,
            result,
            engine_config=config.name,
            hourly_usd=config.hardware.hourly_usd,
            hardware_count=config.hardware.count,
        )
        typer.echo(f"wrote run directory {out}", err=True)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.summary, indent=2) + "\n")
    typer.echo(format_summary(result.summary))
    if result.summary["requests"]["sent"] and not result.summary["requests"]["ok"]:
        first = next(r.error for r in result.records if r.error)
        typer.secho(f"error: no request succeeded; the first failure: {first}", err=True, fg="red")
        raise typer.Exit(1)


def format_summary(s: dict) -> str:
    """The summary as a few aligned lines."""
    req = s["requests"]

    def q(d: dict) -> str:
        return "  ".join(
            f"{k} {d[k]:8.1f}" if d[k] is not None else f"{k}        -"
            for k in ("p50", "p95", "p99")
        )

    ratio = s["prompt_tokens_over_planned_p50"]
    return "\n".join([
        f"chat load {s['run_id']}: {req['sent']} requests in {s['window_s']:.1f} s "
        f"({s['achieved_rate']:.2f}/s), {s['sessions']} sessions, replicas {', '.join(s['replicas'])}",
        f"  ok {req['ok']}  failed {req['failed']}  cancelled {req['cancelled']}  "
        f"not sent {req['not_sent']}",
        f"  TTFT ms  {q(s['ttft_ms'])}",
        f"  ITL ms   {q(s['itl_ms'])}   (over {s['itl_ms']['n']} token gaps)",
        f"  E2E ms   {q(s['e2e_ms'])}",
        f"  prompt {s['prompt_tokens_mean']:.0f} tokens mean"
        + (f" ({ratio:.2f} x planned)" if ratio is not None else "")
        + f", prefix-cache hit share {s['prefix_cache_hit_share']:.2f}",
    ])  # fmt: skip


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg="red")
    raise typer.Exit(2)
