"""Simulator settings: engine knobs, workloads, control loop and run length, all validated up front.

Impossible settings (a budget below one token, a negative rate) fail here with a message naming the
field, before any virtual time passes. Engine fields carry vLLM's names in underscore form; the CLI
fills them from an engine config's dash-form flags.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scheduler.slo import SLO


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineParams(_Strict):
    """One replica's engine, in the terms of vLLM's flags."""

    max_num_batched_tokens: int = Field(2048, ge=1, description="Token budget of one engine step.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts across steps.")
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="Largest prefill chunk of one request in one step; 0 for no cap."
    )
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV of full blocks by content.")
    block_size: int = Field(16, ge=1, description="Tokens per KV block.")
    kv_capacity_tokens: int = Field(500_000, ge=1, description="KV cache size, in tokens.")
    max_model_len: int = Field(131_072, ge=1, description="Longest prompt plus output accepted.")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority", description="Waiting-queue order and preemption victim choice."
    )
    step_time_ratio: float = Field(
        1.0,
        gt=0,
        description="Real step time over the latency model's: the fit the controller and the "
        "plug-in are given is this far off (a fit from another host, or another hour of it).",
    )
    request_overhead_s: float = Field(
        0.0,
        ge=0,
        description="Seconds from a request's submission to its arrival at the engine's "
        "scheduler (the API server: HTTP, tokenization); part of every time to first token.",
    )
    step_time_spread: tuple[float, ...] = Field(
        (),
        description="Quantiles, evenly spaced from 0 to 1, of a real step's time over its mean "
        "(mean 1); each step draws one. Empty: every step takes exactly its price.",
    )

    @model_validator(mode="after")
    def _spread_is_quantiles(self) -> EngineParams:
        q = self.step_time_spread
        if q and (len(q) < 2 or q[0] <= 0 or any(b < a for a, b in zip(q, q[1:], strict=False))):
            raise ValueError(
                f"step_time_spread must be at least two positive quantiles in rising order, got "
                f"{q[:5]}{'...' if len(q) > 5 else ''}; leave it empty for exact step times"
            )
        return self

    @model_validator(mode="after")
    def _kv_holds_a_block(self) -> EngineParams:
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"kv_capacity_tokens ({self.kv_capacity_tokens}) is below one block "
                f"({self.block_size} tokens): raise it or lower block_size"
            )
        return self


class ChatWorkload(_Strict):
    """Live chat: Poisson sessions of RAG-style turns, or a replayed trace.

    The default shape (6k shared system prompt, 1k retrieved context per user, 150-token questions,
    250-token answers, 4 turns) keeps about 5 requests/s inside what a 70B FP8 replica on 2×H100
    serves without queueing; 4k of context at that rate saturates it.
    """

    rate: float = Field(0.0, ge=0, description="Mean chat requests per second; 0 for none.")
    trace: str | None = Field(None, description="CSV `TIMESTAMP,ContextTokens,GeneratedTokens`.")
    trace_speedup: float = Field(
        1.0, gt=0, description="Replay the trace this many times faster (2: twice as fast)."
    )
    trace_shared_prefix_tokens: int = Field(
        0, ge=0, description="Leading tokens every trace request shares (its system prompt)."
    )
    system_prompt_tokens: int = Field(6000, ge=0, description="Shared system prompt length.")
    context_tokens: int = Field(1000, ge=0, description="Retrieved context per user.")
    retrieval_per_turn: bool = Field(
        False, description="Retrieve fresh context every turn instead of once per session."
    )
    user_tokens: int = Field(150, ge=1, description="Mean length of one user message.")
    output_tokens: int = Field(250, ge=1, description="Mean length of one answer.")
    turns_mean: float = Field(4.0, ge=1, description="Mean turns per session (geometric).")
    think_time_s: float = Field(10.0, ge=0, description="Mean pause between answer and next turn.")

    @model_validator(mode="after")
    def _one_source(self) -> ChatWorkload:
        if self.rate > 0 and self.trace:
            raise ValueError("rate and trace: give a chat rate or a trace, not both")
        return self


class BatchWorkload(_Strict):
    """The nightly backlog: `docs` documents of `doc_tokens` tokens each."""

    docs: int = Field(0, ge=0, description="Documents in the backlog.")
    doc_tokens: int = Field(80_000, ge=1, description="Tokens per document.")
    summary_tokens: int = Field(192, ge=1, description="Output tokens of a document summary.")
    section_summary_tokens: int = Field(
        96, ge=1, description="Output tokens of one section's summary (map mode)."
    )
    instruction_tokens: int = Field(200, ge=0, description="Instruction every batch prompt shares.")
    mode: Literal["map", "whole"] = Field(
        "map",
        description="`map`: sections of `section_tokens` (a static-engine baseline's smaller "
        "section size wins), each its own request, then a reduce over their summaries; `whole`: "
        "one request per document, its prefill chunks sized by the engine plug-in.",
    )
    section_tokens: int = Field(
        8192, ge=1, description="Document tokens per section in map mode: a job setting."
    )
    start_s: float = Field(0.0, ge=0, description="Virtual time at which the backlog appears.")


class ControlParams(_Strict):
    """How often the admission policy looks and how far back its sensors see."""

    interval_s: float = Field(2.0, gt=0, description="Virtual seconds between decisions.")
    observe_window_s: float | None = Field(
        None, gt=0, description="Sensor window; None for one interval."
    )


class SimConfig(_Strict):
    """One simulated run."""

    name: str = Field("sim", description="Replica class name; replicas are NAME-0, NAME-1, ...")
    run_id: str = Field("sim", description="Run id written into every record.")
    replicas: int = Field(1, ge=1, description="Identical replicas behind one router.")
    duration_s: float = Field(600.0, gt=0, description="Virtual seconds to simulate.")
    drain_s: float = Field(
        120.0, ge=0, description="Longest time chat in flight at the end may take to finish."
    )
    seed: int = Field(0, description="Seed of every random draw.")
    engine: EngineParams = Field(default_factory=EngineParams, description="Engine of a replica.")
    chat: ChatWorkload = Field(default_factory=ChatWorkload, description="Chat traffic.")
    batch: BatchWorkload = Field(default_factory=BatchWorkload, description="Batch backlog.")
    control: ControlParams = Field(default_factory=ControlParams, description="Control loop.")
    slo: SLO = Field(default_factory=SLO, description="Chat SLO the summary scores windows by.")


def sim_config(name: str, **settings: Any) -> SimConfig:
    """A validated run of replica class `name`; `settings` are SimConfig fields (nested as dicts)."""
    return SimConfig.model_validate({"name": name, **settings})


def with_settings(cfg: SimConfig, settings: Iterable[tuple[str, Any]]) -> SimConfig:
    """`cfg` with each (dotted path, value) set, e.g. ("chat.output_tokens", 200), revalidated.
    A path through a section that does not exist fails naming the sections there are."""
    data = cfg.model_dump()
    for path, value in settings:
        *sections, field = path.split(".")
        node = data
        for section in sections:
            if not isinstance(node.get(section), dict):
                raise ValueError(
                    f"--set {path}={value!r}: no settings section {section!r}; sections: "
                    f"{', '.join(k for k, v in data.items() if isinstance(v, dict))}"
                )
            node = node[section]
        node[field] = value
    return SimConfig.model_validate(data)


def explain(exc: ValidationError, option_of: Mapping[str, str] | None = None) -> str:
    """A settings validation error in the user's terms: engine fields by their engine flag name,
    other settings by the option behind them (`option_of`: dotted path → option) or their path."""
    names = option_of or {}
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join(loc)
        if loc and loc[0] == "engine" and len(loc) > 1:
            where = f"engine flag {loc[1].replace('_', '-')} (engine config or --override)"
        else:
            where = names.get(path, path or "settings")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting; check its spelling against simulator/config.py"
        got = "" if isinstance(err.get("input"), dict) else f" (got {err.get('input')!r})"
        lines.append(f"{where}: {msg}{got}")
    return "invalid simulation settings\n  " + "\n  ".join(lines)
