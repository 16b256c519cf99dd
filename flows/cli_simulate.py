"""`nightshift simulate`: run a replica class in virtual time under chat and batch load.

Parses the options and prints the summary; the work is `bench.sim_run.run_simulation` (the engine
config read as the launcher reads it, the policy built as the Gate builds it). Results: the OUT.json
summary and, with `--records`, a run directory the warehouse loads like any real run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from flows.cli_options import JsonOut, PolicyOption, write_json

OPTION_OF = {
    "chat.rate": "--chat-rate",
    "chat.trace_speedup": "--trace-speedup",
    "batch.docs": "--batch-docs",
    "batch.doc_tokens": "--doc-tokens",
    "batch.mode": "--batch-mode",
    "chat.context_tokens": "--context-tokens",
    "chat.system_prompt_tokens": "--system-prompt-tokens",
    "seed": "--seed",
    "duration_s": "--duration",
    "replicas": "--replicas",
    "control.interval_s": "--control-interval",
    "slo.chat_itl_p99_ms": "--itl-slo-ms",
    "slo.chat_ttft_p99_ms": "--ttft-slo-ms",
}
"""CLI option behind each simulator setting, so validation errors name what the user typed."""


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)


def simulate_command(
    engine_config: Annotated[Path, typer.Option(help="Engine config YAML of the replica class.")],
    json_out: JsonOut = None,
    override: Annotated[
        list[str] | None,
        typer.Option(help="Change an engine flag, KEY=VALUE in dash form (repeatable)."),
    ] = None,
    chat_rate: Annotated[float, typer.Option(help="Chat requests per second (Poisson).")] = 0.0,
    chat_trace: Annotated[
        Path | None, typer.Option(help="Replay a TIMESTAMP,ContextTokens,GeneratedTokens CSV.")
    ] = None,
    trace_speedup: Annotated[
        float, typer.Option(help="Replay the trace this many times faster.")
    ] = 1.0,
    context_tokens: Annotated[int, typer.Option(help="Retrieved context per chat user.")] = 1000,
    system_prompt_tokens: Annotated[int, typer.Option(help="Shared chat system prompt.")] = 6000,
    batch_docs: Annotated[int, typer.Option(help="Documents in the nightly backlog.")] = 0,
    doc_tokens: Annotated[int, typer.Option(help="Tokens per document.")] = 80_000,
    batch_mode: Annotated[str, typer.Option(help="map (sections) or whole (documents).")] = "map",
    policy: PolicyOption = "none",
    static_seats: Annotated[
        int, typer.Option(help="Batch seats of --policy static or budget.")
    ] = 4,
    static_chunk: Annotated[int, typer.Option(help="Chunk tokens of --policy static.")] = 2048,
    budget_target_ms: Annotated[
        float, typer.Option(help="Batch step target of --policy budget.")
    ] = 40.0,
    control_interval: Annotated[float, typer.Option(help="Seconds between decisions.")] = 2.0,
    itl_slo_ms: Annotated[float, typer.Option(help="Chat ITL p99 SLO.")] = 50.0,
    ttft_slo_ms: Annotated[float, typer.Option(help="Chat TTFT p99 SLO.")] = 1000.0,
    duration: Annotated[
        float | None,
        typer.Option(
            help="Virtual seconds to simulate (default: the whole --chat-trace, else 600)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    replicas: Annotated[int, typer.Option(help="Identical replicas behind one router.")] = 1,
    latency_model: Annotated[
        Path | None, typer.Option(help="Fitted latency model JSON (from `nightshift calibrate`).")
    ] = None,
    kv_capacity_tokens: Annotated[
        int | None, typer.Option(help="KV pool size in tokens (default: from the planner).")
    ] = None,
    records: Annotated[
        Path | None, typer.Option(help="Write requests/token_gaps/decisions Parquet here.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option(help="Run id of the records (default: the --records folder name).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any simulator setting, SECTION.FIELD=VALUE, e.g. chat.output_tokens=200 "
            "(sections: chat, batch, control, engine; see simulator/config.py).",
        ),
    ] = None,
) -> None:
    """Simulate replicas of an engine config in virtual time and summarize chat and batch."""
    from pydantic import ValidationError

    from bench.sim_run import SimRequest, run_simulation
    from scheduler.policy_factory import PolicyChoice
    from simulator.config import explain

    try:
        request = SimRequest(
            engine_config=engine_config,
            policy=PolicyChoice(policy, static_seats, static_chunk, budget_target_ms),
            overrides=tuple(override or ()), settings=tuple(set_ or ()),
            chat={"rate": chat_rate, "trace": str(chat_trace) if chat_trace else None,
                  "trace_speedup": trace_speedup, "context_tokens": context_tokens,
                  "system_prompt_tokens": system_prompt_tokens},
            batch={"docs": batch_docs, "doc_tokens": doc_tokens, "mode": batch_mode},
            control={"interval_s": control_interval},
            slo={"chat_itl_p99_ms": itl_slo_ms, "chat_ttft_p99_ms": ttft_slo_ms},
            duration_s=duration, seed=seed, replicas=replicas, latency_model=latency_model,
            kv_capacity_tokens=kv_capacity_tokens, records=records, run_id=run_id,
        )  # fmt: skip
        result = run_simulation(request)
    except ValidationError as exc:
        _fail(explain(exc, OPTION_OF))
    except (ValueError, OSError) as exc:  # config, spec, planner, trace and model errors
        _fail(str(exc))
    to_stdout = write_json(json_out, result.summary)
    if records is not None:
        typer.echo(f"wrote records to {records}", err=True)
    _print(result.summary, err=to_stdout)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _print(summary: dict, err: bool = False) -> None:
    chat, batch = summary["chat"], summary["batch"]

    def q(d: dict, digits: int = 0) -> str:
        return " / ".join("-" if v is None else f"{v:,.{digits}f}" for v in d.values())

    typer.echo(
        f"simulated {summary['sim_seconds']:,.0f} s in {summary['wall_seconds']:.1f} s wall\n"
        f"chat  {chat['requests']} requests, TTFT p50/p95/p99 {q(chat['ttft_ms'])} ms, "
        f"ITL {q(chat['itl_ms'], 1)} ms, SLO met in {100 * chat['slo_windows_met']:.0f}% of windows\n"
        f"batch {batch['docs_done']} documents, {batch['tokens_per_s']:,.0f} tokens/s\n"
        f"preemptions {summary['preemptions']}, KV peak {100 * summary['kv_peak']:.0f}%",
        err=err,
    )
