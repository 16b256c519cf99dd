"""Capacity planning from specs: KV and weight memory, concurrency, decode roofline, chunk sizes.

The arithmetic of docs/design.md §9, kept pure so that `nightshift plan`, the simulator and tests share it.
KV memory, not weights, caps concurrency; decode re-reads weights plus every sequence's KV each step,
so it is bandwidth-bound; and a prefill chunk that is safe at the start of a long prompt is too slow
deep into it, so chunk advice is given per prefix position.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from scheduler.latency_model import LatencyModel, largest_chunk_within, roofline_model
from scheduler.specs import GpuSpec, ModelSpec, dtype_bytes, gpu_spec, model_spec
from scheduler.step import PrefillChunk, StepBatch

GB = 1e9
BLOCK_TOKENS = 16
"""vLLM's default KV block size: KV is allocated, and prefixes shared, in whole blocks."""
DEFAULT_RESERVE_GB_PER_GPU = 5.0
"""Memory kept free of weights and KV on each GPU: activations, CUDA context, NCCL buffers.
5 GB per GPU is what reproduces the seed card's ~80 GB of KV on 2×H100 for 70B FP8."""
CHUNK_POSITIONS = (0, 8192, 16384, 32768, 65536, 79872)
"""Prefix positions where chunk advice is given: up to 78k, deep into an 80k-token document."""
CHUNK_GRANULARITY = 16
"""Chunk sizes are advised in multiples of one KV block."""


class PlanError(ValueError):
    """Inputs that cannot make a working replica; the message gives the numbers and the fix."""


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Share of datasheet peaks real kernels reach, for the `_est` twins of the roofline bounds.

    Defaults are typical of vLLM on Hopper: decode GEMV and paged attention stream HBM at ~70% of
    peak; prefill GEMMs reach ~50% of dense peak once attention and norms are counted; a step
    carries ~2 ms of scheduling, sampling and launch overhead with CUDA graphs.
    """

    flops: float = 0.5
    """Fraction of dense peak FLOP/s reached."""
    bandwidth: float = 0.7
    """Fraction of peak memory bandwidth reached."""
    overhead_s: float = 0.002
    """Fixed seconds per engine step."""


@dataclass(frozen=True, slots=True)
class ChunkAdvice:
    """The largest prefill chunk whose step fits the ITL SLO at one prefix position."""

    prefix_tokens: int
    chunk_tokens: int


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str, gpus: int = 1) -> float:
    """KV bytes one token holds across the replica: K and V per layer per KV head. Tensor
    parallelism wider than the KV heads replicates them, so `gpus` can raise the figure."""
    return 2 * spec.layers * max(spec.kv_heads, gpus) * spec.head_dim * dtype_bytes(kv_dtype)


def weights_bytes(spec: ModelSpec, weight_dtype: str) -> float:
    """Bytes of all weights stored in `weight_dtype`."""
    return spec.params * dtype_bytes(weight_dtype)


def default_reserve_bytes(gpus: int) -> float:
    """Non-KV, non-weight memory the planner keeps free when none is given."""
    return DEFAULT_RESERVE_GB_PER_GPU * GB * gpus


def usable_kv_bytes(
    spec: ModelSpec,
    gpu: GpuSpec,
    gpus: int,
    weight_dtype: str,
    reserve_bytes: float,
    gpu_memory_utilization: float = 1.0,
) -> float:
    """Memory left for KV: the engine's share of device memory minus weights and the reserve.
    Raises `PlanError` with the numbers when the weights do not fit."""
    budget = gpu_memory_utilization * gpu.memory_bytes * gpus
    weights = weights_bytes(spec, weight_dtype)
    usable = budget - weights - reserve_bytes
    if usable <= 0:
        share = f" at utilization {gpu_memory_utilization:g}" if gpu_memory_utilization < 1 else ""
        raise PlanError(
            f"{spec.name} weights in {weight_dtype} take {weights / GB:.1f} GB but {gpus} × "
            f"{gpu.name} give {budget / GB:.1f} GB{share} with {reserve_bytes / GB:.1f} GB "
            "reserved: use more GPUs, a larger GPU, or a smaller weight dtype (fp8, int4)"
        )
    return usable


def kv_capacity_tokens(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    gpus: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    gpu_memory_utilization: float | None = None,
    reserve_gb: float | None = None,
) -> int:
    """Tokens the replica's KV pool holds, in whole blocks.

    Give `gpu_memory_utilization` as an engine config sets it: the engine fills that share of
    memory with weights, activations and KV, the rest is the reserve, so `reserve_gb` defaults to 0
    then. Without it the planner's reserve (5 GB per GPU unless `reserve_gb`) is kept free.
    """
    m = model if isinstance(model, ModelSpec) else model_spec(model)
    g = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if gpu_memory_utilization is None:
        utilization = 1.0
        reserve = default_reserve_bytes(gpus) if reserve_gb is None else reserve_gb * GB
    else:
        if not 0 < gpu_memory_utilization <= 1:
            raise PlanError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        utilization, reserve = gpu_memory_utilization, (reserve_gb or 0.0) * GB
    usable = usable_kv_bytes(m, g, gpus, weight_dtype, reserve, utilization)
    blocks = int(usable // (kv_bytes_per_token(m, kv_dtype, gpus) * BLOCK_TOKENS))
    return blocks * BLOCK_TOKENS


def max_concurrent_seqs(capacity_tokens: int, context: int, shared_prefix: int = 0) -> int:
    """Sequences of `context` tokens the KV pool holds at once when the first `shared_prefix`
    tokens of each are one cached prefix, stored once (in whole blocks, as prefix caching shares)."""
    shared = (shared_prefix // BLOCK_TOKENS) * BLOCK_TOKENS
    private = math.ceil((context - shared) / BLOCK_TOKENS) * BLOCK_TOKENS
    return max(0, (capacity_tokens - shared) // private)


def decode_batch(seqs: int, context: int) -> StepBatch:
    """A decode-only step: `seqs` sequences each attending over `context` tokens."""
    return StepBatch(decode_seqs=seqs, decode_context_tokens=seqs * context)


def engine_memory_utilization(memory_bytes: float, reserve_bytes: float) -> float:
    """The `gpu-memory-utilization` that leaves the reserve outside the engine, rounded down to a
    hundredth and capped at 0.95 (the engine refuses to start if it cannot find that much free)."""
    return min(0.95, math.floor(100 * (1 - reserve_bytes / memory_bytes)) / 100)


def recommended_chunks(
    latency: LatencyModel,
    budget_s: float,
    decode_seqs: int,
    decode_context_tokens: int,
    horizon: int,
    positions: tuple[int, ...] = CHUNK_POSITIONS,
) -> list[ChunkAdvice]:
    """Largest chunk per prefix position below `horizon` that fits `budget_s` beside the decode load."""
    return [
        ChunkAdvice(
            p,
            largest_chunk_within(
                latency,
                budget_s,
                prefix_tokens=p,
                decode_seqs=decode_seqs,
                decode_context_tokens=decode_context_tokens,
                max_chunk=horizon - p,
                granularity=CHUNK_GRANULARITY,
            ),
        )
        for p in positions
        if p < horizon
    ]


@dataclass
class Plan:
    """Everything `nightshift plan` reports; `to_dict` is its JSON (issue 3 item 2)."""

    model: str
    gpu: str
    gpus: int
    weight_dtype: str
    kv_dtype: str
    context: int
    shared_prefix: int
    itl_slo_ms: float
    memory_bytes: float
    reserve_bytes: float
    kv_bytes_per_token: float
    weights_bytes: float
    usable_kv_bytes: float
    kv_capacity_tokens: int
    max_concurrent_seqs: int
    decode_batch: int
    decode_bytes_per_step: float
    decode_step_ms_bound: float
    decode_tokens_per_s_bound: float
    decode_step_ms_est: float
    decode_tokens_per_s_est: float
    prompt_tokens: int
    prefill_s: float
    prefill_s_est: float
    recommended_chunk_tokens: list[ChunkAdvice]
    max_model_len: int
    gpu_memory_utilization: float
    hourly_usd: float
    efficiency: Efficiency
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict: chunk advice as `{prefix_tokens, chunk_tokens}` objects."""
        return asdict(self)


def plan(
    model: str,
    gpu: str,
    gpus: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context: int = 4096,
    shared_prefix: int = 0,
    itl_slo_ms: float = 50.0,
    reserve_gb: float | None = None,
    batch: int | None = None,
    prompt_tokens: int | None = None,
    doc_tokens: int | None = None,
    efficiency: Efficiency = Efficiency(),
) -> Plan:
    """Size one replica of `model` on `gpus` × `gpu`.

    `context` is each sequence's total context, of which `shared_prefix` is one cached prefix;
    decode figures are for `batch` sequences (default: as many as the KV pool holds). `*_bound`
    figures are the pure roofline, `*_est` apply `efficiency`. Chunk advice covers prefix positions
    up to `doc_tokens` (default: the model's max position) at the planned decode load.
    """
    m, g = model_spec(model), gpu_spec(gpu)
    for dtype in (weight_dtype, kv_dtype):
        dtype_bytes(dtype)  # an unknown name fails here, listing the known ones
    horizon = m.max_position if doc_tokens is None else doc_tokens
    _check_inputs(m, gpus, context, shared_prefix, itl_slo_ms, reserve_gb, batch, horizon)
    memory = g.memory_bytes * gpus
    reserve = default_reserve_bytes(gpus) if reserve_gb is None else reserve_gb * GB
    usable = usable_kv_bytes(m, g, gpus, weight_dtype, reserve)
    capacity = kv_capacity_tokens(m, g, gpus, weight_dtype, kv_dtype, reserve_gb=reserve / GB)
    kv_token = kv_bytes_per_token(m, kv_dtype, gpus)
    seqs = max_concurrent_seqs(capacity, context, shared_prefix)
    if seqs == 0:
        raise PlanError(
            f"the KV pool holds {capacity} tokens, less than one sequence of {context} tokens: "
            f"lower --context, use --kv-dtype fp8, or add GPUs"
        )
    b = batch or seqs
    bound = roofline_model(m, g, gpus, weight_dtype, kv_dtype)
    est = roofline_model(
        m,
        g,
        gpus,
        weight_dtype,
        kv_dtype,
        flops_efficiency=efficiency.flops,
        bandwidth_efficiency=efficiency.bandwidth,
        overhead_s=efficiency.overhead_s,
    )
    step_bound = bound.step_seconds(decode_batch(b, context))
    step_est = est.step_seconds(decode_batch(b, context))
    prompt = prompt_tokens or context
    prefill = StepBatch(prefills=(PrefillChunk(prompt, 0),))
    chunks = recommended_chunks(est, itl_slo_ms / 1000, b, b * context, horizon)
    return Plan(
        model=m.name,
        gpu=g.name,
        gpus=gpus,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        context=context,
        shared_prefix=shared_prefix,
        itl_slo_ms=itl_slo_ms,
        memory_bytes=memory,
        reserve_bytes=reserve,
        kv_bytes_per_token=kv_token,
        weights_bytes=weights_bytes(m, weight_dtype),
        usable_kv_bytes=usable,
        kv_capacity_tokens=capacity,
        max_concurrent_seqs=seqs,
        decode_batch=b,
        decode_bytes_per_step=weights_bytes(m, weight_dtype) + b * context * kv_token,
        decode_step_ms_bound=1000 * step_bound,
        decode_tokens_per_s_bound=b / step_bound,
        decode_step_ms_est=1000 * step_est,
        decode_tokens_per_s_est=b / step_est,
        prompt_tokens=prompt,
        prefill_s=bound.step_seconds(prefill),
        prefill_s_est=est.step_seconds(prefill),
        recommended_chunk_tokens=chunks,
        max_model_len=min(max(context, horizon), capacity),
        gpu_memory_utilization=engine_memory_utilization(memory, reserve),
        hourly_usd=g.hourly_usd * gpus,
        efficiency=efficiency,
        warnings=_warnings(b, seqs, step_est, itl_slo_ms, chunks),
    )


def _check_inputs(
    m: ModelSpec,
    gpus: int,
    context: int,
    shared_prefix: int,
    itl_slo_ms: float,
    reserve_gb: float | None,
    batch: int | None,
    horizon: int,
) -> None:
    problems = []
    if gpus < 1 or m.heads % gpus:
        problems.append(
            f"--gpus {gpus}: tensor parallelism splits the {m.heads} attention heads of {m.name}, "
            "so the GPU count must divide them"
        )
    if not 1 <= context <= m.max_position:
        problems.append(f"--context {context}: must be between 1 and {m.max_position} ({m.name})")
    if not 0 <= shared_prefix < context:
        problems.append(f"--shared-prefix {shared_prefix}: must be >= 0 and below --context")
    if itl_slo_ms <= 0:
        problems.append(f"--itl-slo-ms {itl_slo_ms}: must be > 0")
    if reserve_gb is not None and reserve_gb < 0:
        problems.append(f"--reserve-gb {reserve_gb}: must be >= 0")
    if batch is not None and batch < 1:
        problems.append(f"--batch {batch}: must be >= 1")
    if not 1 <= horizon <= m.max_position:
        problems.append(f"--doc-tokens {horizon}: must be between 1 and {m.max_position}")
    if problems:
        raise PlanError("; ".join(problems))


def _warnings(
    batch: int, seqs: int, step_est_s: float, itl_slo_ms: float, chunks: list[ChunkAdvice]
) -> list[str]:
    warnings = []
    if batch > seqs:
        warnings.append(
            f"--batch {batch} exceeds the {seqs} sequences the KV pool holds: the engine would "
            "preempt and recompute"
        )
    if 1000 * step_est_s > itl_slo_ms:
        warnings.append(
            f"decode of {batch} sequences alone takes ~{1000 * step_est_s:.1f} ms per step, above "
            f"the {itl_slo_ms:g} ms ITL SLO: plan fewer sequences (--batch) or more GPUs"
        )
    starved = [c.prefix_tokens for c in chunks if c.chunk_tokens == 0]
    if starved and 1000 * step_est_s <= itl_slo_ms:
        warnings.append(
            f"no prefill chunk fits the ITL SLO at prefix positions {starved}: long prompts "
            "cannot advance there without breaking it at this decode load"
        )
    return warnings
