"""`nightshift chat-load`: production-shaped chat traffic against replicas, alone.

Parses the options and prints the summary; the run is `bench.chat_load_run` (sizes at production
scale times `--scale`, a replica started for the run when no `--replica-url` is given).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from flows.cli_options import JsonOut, write_json

if TYPE_CHECKING:
    from bench.chat_results import ChatLoadResult
    from serving.engine_config import EngineConfig


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
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds of arrivals; default: all of --trace, else 60."),
    ] = None,
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
    json_out: JsonOut = None,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            help="Per-request SLO that goodput counts against, KEY:MS with KEY ttft, tpot or "
            "e2el, as vLLM's --goodput (repeatable; default: ttft:1000 and tpot:50)."
        ),
    ] = None,
) -> None:
    """Play production-shaped chat sessions against replicas and summarize TTFT, TPOT, ITL, E2E
    and goodput."""
    from bench.chat_load_run import (
        ChatLoadInputError,
        ChatLoadOptions,
        check_url,
        load_spec,
        run_chat_load_on,
        run_id_for,
        short_trace_warning,
    )
    from bench.chat_sessions import ChatShape, ShapeError
    from serving.engine_config import EngineConfigError, load_engine_config
    from serving.launcher import EngineStartError
    from serving.paths import SetupError
    from simulator.trace import TraceError

    try:
        config = load_engine_config(engine_config)
        shape = ChatShape(
            system_prompt_tokens=system_prompt_tokens, retrieved_chunks=retrieved_chunks,
            chunk_tokens=chunk_tokens, turns=turns, think_time_s=think_time,
            output_tokens_median=output_tokens, max_tokens=max_tokens,
        )  # fmt: skip
        options = ChatLoadOptions(
            rate=rate, duration=duration, trace=trace, trace_speedup=trace_speedup,
            trace_start=trace_start, shape=shape, scale=scale, seed=seed, grace=grace,
            max_requests=max_requests, routing=routing, goodput=tuple(goodput or ()),
        )  # fmt: skip
        spec = load_spec(config, options)
        urls = [check_url(u) for u in replica_url or []]
        name = run_id_for(run_id, out)
        if warning := short_trace_warning(spec):
            typer.secho(f"warning: {warning}", err=True, fg="yellow")
        result = run_chat_load_on(config, engine_config, spec, urls, port, name, _say, out)
    except (EngineStartError, SetupError) as exc:
        typer.secho(f"could not start a replica: {exc}", err=True, fg="red")
        raise typer.Exit(1) from None
    except (EngineConfigError, ShapeError, TraceError, ChatLoadInputError, ValueError) as exc:
        _fail(str(exc))
    except FileNotFoundError as exc:
        _fail(str(exc))
    _report(result, config, out, json_out)


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _report(
    result: ChatLoadResult, config: EngineConfig, out: Path | None, json_out: Path | None
) -> None:
    from bench.bench_table import csv_path, flatten, write_rows
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
    to_stdout = write_json(json_out, result.summary)
    if (csv := csv_path(json_out)) is not None:
        write_rows([flatten(result.summary)], csv)
        typer.echo(f"wrote {json_out} and {csv}", err=True)
    typer.echo(format_summary(result.summary), err=to_stdout)
    if result.summary["requests"]["sent"] and not result.summary["requests"]["ok"]:
        typer.secho(
            f"error: no request succeeded; the first failure: {result.first_error}",
            err=True,
            fg="red",
        )
        raise typer.Exit(1)


def format_summary(s: dict) -> str:
    """The summary as a few aligned lines."""
    req = s["requests"]

    def q(d: dict) -> str:
        return "  ".join(
            f"{k} {d[k]:8.1f}" if d.get(k) is not None else f"{k}        -"
            for k in ("p50", "p95", "p99")
        )

    ratio = s["prompt_tokens_over_planned_p50"]
    lines = [
        f"chat load {s['run_id']}: {req['sent']} requests in {s['window_s']:.1f} s "
        f"({s['achieved_rate']:.2f}/s), {s['sessions']} sessions, replicas {', '.join(s['replicas'])}",
        f"  ok {req['ok']}  failed {req['failed']}  cancelled {req['cancelled']}  "
        f"not sent {req['not_sent']}",
        f"  TTFT ms  {q(s['ttft_ms'])}",
    ]
    if "tpot_ms" in s:
        lines.append(f"  TPOT ms  {q(s['tpot_ms'])}")
    lines += [
        f"  ITL ms   {q(s['itl_ms'])}   (over {s['itl_ms']['n']} token gaps)",
        f"  E2E ms   {q(s['e2e_ms'])}",
    ]
    if "goodput" in s:
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in s["goodput_slos_ms"].items())
        lines.append(f"  goodput  {s['goodput']:.2f} requests/s ({slos})")
    lines.append(
        f"  prompt {s['prompt_tokens_mean']:.0f} tokens mean"
        + (f" ({ratio:.2f} x planned)" if ratio is not None else "")
        + f", prefix-cache hit share {s['prefix_cache_hit_share']:.2f}"
    )
    return "\n".join(lines)


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg="red")
    raise typer.Exit(2)
