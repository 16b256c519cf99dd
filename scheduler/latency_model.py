"""Step-time model of an engine step (docs/design.md §4.2), from a roofline prior or fitted to measured steps.

    step = max(a·T, b) + c·Σ C·(p + C/2) + d·Σctx + e + f·Σp + g·B

T is the step's scheduled tokens (prefill plus one per decode sequence); a = 2·N / F_eff is the
matmul time per token, b = N·bytes_w / BW_eff the time to stream the weights once, so the linear
part is compute- or bandwidth-bound, whichever is slower. The second term is prefill attention
(c = 4·L·n_q·d_head / F_eff per chunk C at prefix p), the third the decode sequences re-reading
their KV (d = kv_bytes_per_token / BW_eff), and e a fixed per-step overhead (scheduling, kernel
launches).

The last two are costs the first five miss on a real engine. f is paid per prefix token by every
prefill chunk, whatever its size: a chunk at prefix p re-reads the p tokens of KV before it
(f = kv_bytes_per_token / BW_eff), so small chunks deep in a long prompt cost more than c alone
says. g is paid per decode sequence B on top of its token in T: sampling and per-sequence
bookkeeping, which no datasheet prices. Refitted to the 44 steps of the cpu-small calibration
(about 1.6 µs per prefix token per chunk, 0.3 ms per decode sequence), the two cut the fit's mean
error over those steps from 25% to 15%.

The same seven named coefficients describe a GPU from its datasheet and a CPU replica from a
least-squares fit (`scheduler.latency_fit`), so the planner, simulator and controller use one class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.specs import GpuSpec, ModelSpec, dtype_bytes, gpu_spec, model_spec
from scheduler.step import StepBatch, StepTimeModel
from scheduler.step_budget import BatchPrefill, StepBudget

FORMAT = "nightshift.latency_model/2"
"""What `to_json` writes: all seven coefficients."""
FORMAT_V1 = "nightshift.latency_model/1"
"""Files written before f and g existed: the first five coefficients; f and g read as 0."""


def attention_units(batch: StepBatch) -> float:
    """Σ C·(p + C/2) over the step's prefill chunks: query-key pairs a chunk of C tokens at prefix p
    attends over under the causal mask, the quantity prefill attention time is proportional to."""
    return sum(c.tokens * (c.prefix_tokens + c.tokens / 2) for c in batch.prefills)


def chunk_prefix_tokens(batch: StepBatch) -> int:
    """Σ p over the step's prefill chunks: KV tokens the chunks re-read before their own tokens."""
    return sum(c.prefix_tokens for c in batch.prefills)


@dataclass
class LatencyModel:
    """Predicts one engine step's wall time from seven non-negative coefficients (module docstring).

    `source` records what the coefficients were built from (specs and efficiencies, or the fit's
    samples and error) so a saved model explains itself.
    """

    s_per_token: float = 0.0
    """a: matmul seconds per scheduled token (2·N / F_eff)."""
    s_weight_read: float = 0.0
    """b: seconds to stream all weights once (N·bytes / BW_eff), the floor of any step."""
    s_per_attention_unit: float = 0.0
    """c: seconds per prefill attention unit C·(p + C/2)."""
    s_per_context_token: float = 0.0
    """d: seconds per decode-context token re-read from the KV cache."""
    overhead_s: float = 0.0
    """e: fixed seconds per step."""
    s_per_chunk_prefix_token: float = 0.0
    """f: seconds per prefix token re-read by each prefill chunk, independent of its size."""
    s_per_decode_seq: float = 0.0
    """g: seconds per decode sequence beyond its token (sampling, per-sequence bookkeeping)."""
    source: dict = field(default_factory=dict)
    """Provenance: what the model was built from or fitted on."""

    def __post_init__(self) -> None:
        for name, value in self.coefficients().items():
            if not value >= 0:
                raise ValueError(f"latency model coefficient {name} must be >= 0, got {value}")

    def coefficients(self) -> dict[str, float]:
        """The seven coefficients by name, in the order of the module docstring's formula."""
        return {
            "s_per_token": self.s_per_token,
            "s_weight_read": self.s_weight_read,
            "s_per_attention_unit": self.s_per_attention_unit,
            "s_per_context_token": self.s_per_context_token,
            "overhead_s": self.overhead_s,
            "s_per_chunk_prefix_token": self.s_per_chunk_prefix_token,
            "s_per_decode_seq": self.s_per_decode_seq,
        }

    @property
    def knee_tokens(self) -> float:
        """Scheduled tokens per step above which the linear part turns compute-bound."""
        return self.s_weight_read / self.s_per_token if self.s_per_token > 0 else float("inf")

    def step_seconds(self, batch: StepBatch) -> float:
        """Predicted duration of `batch`; an empty step takes no time (the engine does not run one)."""
        tokens = batch.total_tokens
        if tokens == 0:
            return 0.0
        return (
            max(self.s_per_token * tokens, self.s_weight_read)
            + self.s_per_attention_unit * attention_units(batch)
            + self.s_per_context_token * batch.decode_context_tokens
            + self.overhead_s
            + self.s_per_chunk_prefix_token * chunk_prefix_tokens(batch)
            + self.s_per_decode_seq * batch.decode_seqs
        )

    def predict_ms(self, batch: StepBatch) -> float:
        """`step_seconds` in milliseconds, the unit dashboards and SLOs speak."""
        return 1000.0 * self.step_seconds(batch)

    def to_json(self, path: str | Path) -> None:
        """Write coefficients and provenance to `path` as JSON."""
        doc = {"format": FORMAT, "coefficients": self.coefficients(), "source": self.source}
        Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> LatencyModel:
        """Read a model written by `to_json`, now or in format 1 (five coefficients, f and g read
        as 0); a wrong file says which key is missing or unknown."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
            coefficients = doc["coefficients"]
            names = set(coefficients)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: not a latency model file ({exc}); write one with "
                "`nightshift calibrate` or LatencyModel.to_json"
            ) from None
        formats = _coefficient_names()
        fmt = doc.get("format")
        if fmt is not None and fmt not in formats:
            raise ValueError(
                f"{path}: unknown latency model format {fmt!r}; this version reads "
                f"{sorted(formats)}"
            )
        # a file without a format (written by hand) may use either key set
        allowed = [formats[fmt]] if fmt is not None else list(formats.values())
        if names not in allowed:
            declared = f" (format {fmt})" if fmt else ""
            raise ValueError(
                f"{path}: coefficients must be exactly {sorted(allowed[-1])}{declared}, "
                f"got {sorted(names)}"
            )
        return cls(**{k: float(v) for k, v in coefficients.items()}, source=doc.get("source", {}))


def _coefficient_names() -> dict[str, set[str]]:
    """The coefficient names each readable format holds: format 1 lacks f and g."""
    names = list(LatencyModel().coefficients())
    return {FORMAT_V1: set(names[:5]), FORMAT: set(names)}


def roofline_model(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    gpus: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    efficiency: float | None = None,
    flops_efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
    overhead_s: float = 0.0,
) -> LatencyModel:
    """The roofline prior for `model` tensor-parallel over `gpus` of `gpu`: FLOP/s and bandwidth add
    up across GPUs (all-reduce time is not modelled; on NVLink it is a few % of a decode step).

    Efficiencies scale the datasheet peaks to what kernels reach; `efficiency` sets both at once.
    Attention runs at the BF16 rate because attention kernels compute in 16 bits even over an FP8
    KV cache. A prefill chunk reads its prefix's KV once, like a decode sequence reads its context,
    so f = d; g (per decode sequence) has no roofline counterpart and is 0.
    """
    m = model if isinstance(model, ModelSpec) else model_spec(model)
    g = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if efficiency is not None:
        flops_efficiency = bandwidth_efficiency = efficiency
    if not (0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
        raise ValueError(
            f"efficiencies must be in (0, 1], got flops {flops_efficiency}, "
            f"bandwidth {bandwidth_efficiency}"
        )
    matmul_flops = gpus * g.matmul_flops(weight_dtype) * flops_efficiency
    attention_flops = gpus * g.bf16_flops * flops_efficiency
    bandwidth = gpus * g.hbm_bytes_per_s * bandwidth_efficiency
    kv_per_token = 2 * m.layers * max(m.kv_heads, gpus) * m.head_dim * dtype_bytes(kv_dtype)
    return LatencyModel(
        s_per_token=2 * m.params / matmul_flops,
        s_weight_read=m.params * dtype_bytes(weight_dtype) / bandwidth,
        s_per_attention_unit=4 * m.layers * m.heads * m.head_dim / attention_flops,
        s_per_context_token=kv_per_token / bandwidth,
        overhead_s=overhead_s,
        s_per_chunk_prefix_token=kv_per_token / bandwidth,
        source={
            "kind": "roofline",
            "model": m.name,
            "gpu": g.name,
            "gpus": gpus,
            "weight_dtype": weight_dtype,
            "kv_dtype": kv_dtype,
            "flops_efficiency": flops_efficiency,
            "bandwidth_efficiency": bandwidth_efficiency,
        },
    )


def largest_chunk_within(
    model: StepTimeModel,
    budget_s: float,
    prefix_tokens: int,
    decode_seqs: int,
    decode_context_tokens: int,
    max_chunk: int,
    granularity: int = 16,
) -> int:
    """The largest prefill chunk (a multiple of `granularity`, at most `max_chunk`) at prefix
    position `prefix_tokens` whose step, beside the given decode load, fits `budget_s`; 0 if none.

    The engine plug-in's own sizing (`scheduler.step_budget`) for a step of one batch prefill, so
    the planner's advice is what the plug-in would grant.
    """
    if granularity < 1:
        raise ValueError(f"granularity must be >= 1, got {granularity}")
    whole = max_chunk // granularity * granularity
    fixed = StepBatch((), decode_seqs, decode_context_tokens)
    budget = StepBudget(model, budget_s, whole, fixed, granularity)
    return budget.grant(BatchPrefill(prefix_tokens, whole))
