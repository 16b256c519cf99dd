"""`nightshift simulate`: run a replica class in virtual time under chat and batch load.

The engine config is read as the launcher reads it; this module turns its flags and hardware into
the simulator's engine settings (KV capacity from the planner, step times from the roofline prior or
a fitted model) because `simulator/` may not import `serving/`. Results: the OUT.json summary and,
with `--records`, a run directory the warehouse loads like any real run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from scheduler.step import StepTimeModel
    from serving.engine_config import EngineConfig
    from simulator.simulation import PolicyFactory

CONTROLLERS = ("none", "static", "budget", "slo")
POLICY_NAMES = {"none": "uncontrolled", "static": "static", "budget": "static-budget", "slo": "slo"}
"""Names the runs table uses for each `--controller` choice."""
WEIGHT_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "auto": "bf16", "float16": "fp16"}
WEIGHT_DTYPES |= {"half": "fp16", "fp16": "fp16"}
KV_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")
CPU_KV_DEFAULT_GIB = 4.0
"""vLLM-CPU's KV space when VLLM_CPU_KVCACHE_SPACE is unset."""
OPTION_OF = {
    "chat.rate": "--chat-rate",
    "chat.trace_time_scale": "--trace-time-scale",
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


class SimulateError(ValueError):
    """Bad input to `nightshift simulate`; the message names the option and the fix."""


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)


def simulate_command(
    engine_config: Annotated[Path, typer.Option(help="Engine config YAML of the replica class.")],
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the run summary (OUT.json) here.")
    ] = None,
    override: Annotated[
        list[str] | None,
        typer.Option(help="Change an engine flag, KEY=VALUE in dash form (repeatable)."),
    ] = None,
    chat_rate: Annotated[float, typer.Option(help="Chat requests per second (Poisson).")] = 0.0,
    chat_trace: Annotated[
        Path | None, typer.Option(help="Replay a TIMESTAMP,ContextTokens,GeneratedTokens CSV.")
    ] = None,
    trace_time_scale: Annotated[float, typer.Option(help="Stretch trace time by this.")] = 1.0,
    context_tokens: Annotated[int, typer.Option(help="Retrieved context per chat user.")] = 1000,
    system_prompt_tokens: Annotated[int, typer.Option(help="Shared chat system prompt.")] = 6000,
    batch_docs: Annotated[int, typer.Option(help="Documents in the nightly backlog.")] = 0,
    doc_tokens: Annotated[int, typer.Option(help="Tokens per document.")] = 80_000,
    batch_mode: Annotated[str, typer.Option(help="map (sections) or whole (documents).")] = "map",
    controller: Annotated[
        str, typer.Option(help="Admission policy: none, static, budget or slo.")
    ] = "none",
    static_seats: Annotated[
        int, typer.Option(help="Batch seats of --controller static or budget.")
    ] = 4,
    static_chunk: Annotated[int, typer.Option(help="Chunk tokens of --controller static.")] = 2048,
    budget_target_ms: Annotated[
        float, typer.Option(help="Batch step target of --controller budget.")
    ] = 40.0,
    control_interval: Annotated[float, typer.Option(help="Seconds between decisions.")] = 2.0,
    itl_slo_ms: Annotated[float, typer.Option(help="Chat ITL p99 SLO.")] = 50.0,
    ttft_slo_ms: Annotated[float, typer.Option(help="Chat TTFT p99 SLO.")] = 1000.0,
    duration: Annotated[float, typer.Option(help="Virtual seconds to simulate.")] = 600.0,
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

    from simulator.run import simulate
    from simulator.workloads import load_trace

    try:
        cfg = load_profile(engine_config, override or [])
        model = step_model(cfg, latency_model)
        sim_cfg = sim_config(
            cfg,
            engine=engine_params(cfg, kv_capacity_tokens),
            chat={"rate": chat_rate, "trace": str(chat_trace) if chat_trace else None,
                  "trace_time_scale": trace_time_scale, "context_tokens": context_tokens,
                  "system_prompt_tokens": system_prompt_tokens},
            batch={"docs": batch_docs, "doc_tokens": doc_tokens, "mode": batch_mode},
            control={"interval_s": control_interval},
            slo={"chat_itl_p99_ms": itl_slo_ms, "chat_ttft_p99_ms": ttft_slo_ms},
            duration_s=duration, seed=seed, replicas=replicas,
            run_id=run_id or (records.name if records else "sim"),
        )  # fmt: skip
        sim_cfg = apply_settings(sim_cfg, set_ or [])
        policy = policy_factory(
            controller,
            sim_cfg,
            model,
            static_seats,
            static_chunk,
            cfg.controller,
            budget_target_ms,
        )
        trace = load_trace(chat_trace, trace_time_scale) if chat_trace else None
    except ValidationError as exc:
        _fail(explain(exc))
    except (ValueError, OSError) as exc:  # config, spec, planner, trace and model errors
        _fail(str(exc))
    result = simulate(sim_cfg, model, policy, trace)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.summary, indent=2) + "\n")
    if records is not None:
        write_records(records, result, cfg, POLICY_NAMES[controller])
    _print(result.summary)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def load_profile(path: Path, overrides: list[str]) -> EngineConfig:
    """The engine config at `path` with `--override KEY=VALUE` flags applied and revalidated."""
    from pydantic import ValidationError

    from serving.engine_config import EngineConfig, load_engine_config

    cfg = load_engine_config(path)
    if not overrides:
        return cfg
    flags = dict(cfg.vllm)
    flags.update(parse_override(item) for item in overrides)
    try:
        return EngineConfig.model_validate({**cfg.model_dump(), "vllm": flags})
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SimulateError(f"--override: {problems}") from None


def parse_override(item: str, option: str = "--override") -> tuple[str, Any]:
    """`enable-chunked-prefill=false` → ("enable-chunked-prefill", False); ints and floats too."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise SimulateError(f"{option} {item!r}: write KEY=VALUE, e.g. max-num-batched-tokens=512")
    text = text.strip()
    if text.lower() in ("true", "false"):
        return key.strip(), text.lower() == "true"
    for kind in (int, float):
        try:
            return key.strip(), kind(text)
        except ValueError:
            pass
    return key.strip(), text


def _dtypes(cfg: EngineConfig) -> tuple[str, str]:
    """(weight dtype, KV dtype) in the planner's names, from `quantization`, `dtype` and
    `kv-cache-dtype`; `auto` KV follows the activation dtype, not FP8 weights."""
    quantization = cfg.flag("quantization")
    dtype = str(cfg.flag("dtype", "auto")).lower()
    if dtype not in WEIGHT_DTYPES:
        raise SimulateError(f"flag dtype={dtype!r}: the simulator knows {sorted(WEIGHT_DTYPES)}")
    if quantization not in (None, "fp8"):
        raise SimulateError(
            f"flag quantization={quantization!r}: the simulator prices fp8 or 16-bit weights; "
            "pass --latency-model and --kv-capacity-tokens for other schemes"
        )
    weight = "fp8" if quantization == "fp8" else WEIGHT_DTYPES[dtype]
    kv = str(cfg.flag("kv-cache-dtype", "auto")).lower()
    return weight, "fp8" if kv in KV_FP8 else WEIGHT_DTYPES.get(kv, WEIGHT_DTYPES[dtype])


def _spec(cfg: EngineConfig):
    from scheduler.specs import model_spec

    if cfg.model.spec is None:
        raise SimulateError(
            f"engine config {cfg.name}: model.spec is not set; name a model of the planner's spec "
            "table so the simulator knows its shape"
        )
    return model_spec(cfg.model.spec)


def step_model(cfg: EngineConfig, fitted: Path | None) -> StepTimeModel:
    """A fitted model when given, else the roofline prior at the planner's typical efficiencies."""
    from scheduler.latency_model import LatencyModel, roofline_model
    from scheduler.planner import Efficiency

    if fitted is not None:
        return LatencyModel.from_json(fitted)
    if cfg.hardware.gpu_type is None:
        raise SimulateError(
            f"engine config {cfg.name} has no hardware.gpu_type, so there is no roofline to price "
            "its steps: pass --latency-model FIT.json (from `nightshift calibrate`)"
        )
    weight, kv = _dtypes(cfg)
    eff = Efficiency()
    return roofline_model(
        _spec(cfg), cfg.hardware.gpu_type, cfg.hardware.count, weight, kv,
        flops_efficiency=eff.flops, bandwidth_efficiency=eff.bandwidth, overhead_s=eff.overhead_s,
    )  # fmt: skip


def kv_capacity(cfg: EngineConfig) -> int:
    """KV pool tokens: the planner's figure on GPUs, VLLM_CPU_KVCACHE_SPACE on CPU replicas."""
    from scheduler.planner import BLOCK_TOKENS, kv_bytes_per_token
    from scheduler.planner import kv_capacity_tokens as planner_capacity

    weight, kv = _dtypes(cfg)
    spec = _spec(cfg)
    if cfg.hardware.gpu_type is not None:
        utilization = float(cfg.flag("gpu-memory-utilization", 0.9))
        return planner_capacity(
            spec, cfg.hardware.gpu_type, cfg.hardware.count, weight, kv,
            gpu_memory_utilization=utilization,
        )  # fmt: skip
    gib = float(cfg.env.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_DEFAULT_GIB))
    blocks = int(gib * 2**30 // (kv_bytes_per_token(spec, kv) * BLOCK_TOKENS))
    return blocks * BLOCK_TOKENS


def engine_params(cfg: EngineConfig, capacity: int | None = None) -> dict:
    """The simulator's engine settings from the config's flags (vLLM defaults where unset)."""
    max_len = cfg.flag("max-model-len")
    if max_len is None:
        max_len = _spec(cfg).max_position
    flags = {
        "max_num_batched_tokens": cfg.flag("max-num-batched-tokens", 2048),
        "enable_chunked_prefill": cfg.flag("enable-chunked-prefill", True),
        "long_prefill_token_threshold": cfg.flag("long-prefill-token-threshold", 0),
        "max_num_seqs": cfg.flag("max-num-seqs", 256),
        "enable_prefix_caching": cfg.flag("enable-prefix-caching", True),
        "block_size": cfg.flag("block-size", default_block_size(cfg)),
        "max_model_len": max_len,
        "scheduling_policy": cfg.flag("scheduling-policy", "fcfs"),
    }
    flags["kv_capacity_tokens"] = capacity if capacity is not None else kv_capacity(cfg)
    return flags


def default_block_size(cfg: EngineConfig) -> int:
    """vLLM's KV block size when the config leaves it out: 128 on its CPU backend, 16 on GPUs.
    Prefix caching reuses whole blocks only, so this sets how much of a shared prompt hits."""
    return 128 if cfg.hardware.kind == "cpu" else 16


def sim_config(cfg: EngineConfig, **settings: Any):
    from simulator.config import SimConfig

    return SimConfig.model_validate({"name": cfg.name, **settings})


def apply_settings(sim_cfg, items: list[str]):
    """`--set chat.output_tokens=200`: change any simulator setting by its dotted path."""
    if not items:
        return sim_cfg
    data = sim_cfg.model_dump()
    for item in items:
        path, value = parse_override(item, "--set")
        *sections, field = path.split(".")
        node = data
        for section in sections:
            if not isinstance(node.get(section), dict):
                raise SimulateError(
                    f"--set {item!r}: no settings section {section!r}; sections: chat, batch, "
                    "control, engine, slo"
                )
            node = node[section]
        node[field] = value
    return type(sim_cfg).model_validate(data)


def explain(exc) -> str:
    """A simulator validation error in the user's terms: engine flags and CLI options by name."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join(loc)
        if loc and loc[0] == "engine" and len(loc) > 1:
            where = f"engine flag {loc[1].replace('_', '-')} (engine config or --override)"
        else:
            where = OPTION_OF.get(path, path or "settings")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting; check its spelling against simulator/config.py"
        got = "" if isinstance(err.get("input"), dict) else f" (got {err.get('input')!r})"
        lines.append(f"{where}: {msg}{got}")
    return "invalid simulation settings\n  " + "\n  ".join(lines)


def policy_factory(
    name: str,
    sim_cfg,
    model: StepTimeModel,
    seats: int,
    chunk: int,
    tuning=None,
    target_ms: float = 40.0,
) -> PolicyFactory:
    """The admission policy behind `--controller`; one SLO controller serves every replica.
    `tuning` is the engine config's `controller:` section, if it has one."""
    from scheduler.admission import FixedBudget, NoAdmissionControl, StaticCaps
    from scheduler.budget_controller import BudgetController

    if name == "none":
        return lambda _replica: NoAdmissionControl()
    if name == "static":
        caps = StaticCaps(seats, chunk)
        return lambda _replica: caps
    if name == "budget":
        fixed = FixedBudget(seats, target_ms)
        return lambda _replica: fixed
    if name == "slo":
        ctrl = BudgetController(sim_cfg.slo, model, tuning, sim_cfg.engine.max_num_seqs)
        return lambda _replica: ctrl
    raise SimulateError(f"--controller {name!r}: choose one of {', '.join(CONTROLLERS)}")


def write_records(directory: Path, result, cfg: EngineConfig, policy: str) -> None:
    """The run as a warehouse run directory: Parquet tables plus run.json."""
    from warehouse.run_files import RunMeta, write_meta, write_table

    sim_cfg = result.sim.cfg
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in result.tables().items():
        write_table(directory, name, table, run_id=sim_cfg.run_id)
    meta = RunMeta(
        run_id=sim_cfg.run_id,
        engine_config=cfg.name,
        policy=policy,
        hardware_count=cfg.hardware.count,
        replicas=sim_cfg.replicas,
        hourly_usd=cfg.hardware.hourly_usd,
        slo=sim_cfg.slo.model_dump(),
        started=0.0,
        ended=sim_cfg.duration_s,
    )
    write_meta(directory, meta)
    typer.echo(f"wrote records to {directory}", err=True)


def _print(summary: dict) -> None:
    chat, batch = summary["chat"], summary["batch"]

    def q(d: dict, digits: int = 0) -> str:
        return " / ".join("-" if v is None else f"{v:,.{digits}f}" for v in d.values())

    typer.echo(
        f"simulated {summary['sim_seconds']:,.0f} s in {summary['wall_seconds']:.1f} s wall\n"
        f"chat  {chat['requests']} requests, TTFT p50/p95/p99 {q(chat['ttft_ms'])} ms, "
        f"ITL {q(chat['itl_ms'], 1)} ms, SLO met in {100 * chat['slo_windows_met']:.0f}% of windows\n"
        f"batch {batch['docs_done']} documents, {batch['tokens_per_s']:,.0f} tokens/s\n"
        f"preemptions {summary['preemptions']}, KV peak {100 * summary['kv_peak']:.0f}%"
    )
