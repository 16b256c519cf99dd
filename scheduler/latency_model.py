"""Step-time model of an engine step (DESIGN §4), from a roofline prior or fitted to measured steps.

    step = max(a·T, b) + c·Σ C·(p + C/2) + d·Σctx + e

T is the step's scheduled tokens (prefill plus one per decode sequence); a = 2·N / F_eff is the
matmul time per token, b = N·bytes_w / BW_eff the time to stream the weights once, so the linear
part is compute- or bandwidth-bound, whichever is slower. The second term is prefill attention
(c = 4·L·n_q·d_head / F_eff per chunk C at prefix p), the third the decode sequences re-reading
their KV (d = kv_bytes_per_token / BW_eff), and e a fixed per-step overhead (scheduling, sampling,
kernel launches). The same five named coefficients describe a GPU from its datasheet and a CPU
replica from a least-squares fit, so the planner, simulator and controller use one class.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from scheduler.specs import GpuSpec, ModelSpec, dtype_bytes, gpu_spec, model_spec
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel

FORMAT = "nightshift.latency_model/1"


def attention_units(batch: StepBatch) -> float:
    """Σ C·(p + C/2) over the step's prefill chunks: query-key pairs a chunk of C tokens at prefix p
    attends over under the causal mask, the quantity prefill attention time is proportional to."""
    return sum(c.tokens * (c.prefix_tokens + c.tokens / 2) for c in batch.prefills)


@dataclass
class LatencyModel:
    """Predicts one engine step's wall time from five non-negative coefficients (module docstring).

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
    source: dict = field(default_factory=dict)
    """Provenance: what the model was built from or fitted on."""

    def __post_init__(self) -> None:
        for name, value in self.coefficients().items():
            if not value >= 0:
                raise ValueError(f"latency model coefficient {name} must be >= 0, got {value}")

    def coefficients(self) -> dict[str, float]:
        """The five coefficients by name, in the order of the module docstring's formula."""
        return {
            "s_per_token": self.s_per_token,
            "s_weight_read": self.s_weight_read,
            "s_per_attention_unit": self.s_per_attention_unit,
            "s_per_context_token": self.s_per_context_token,
            "overhead_s": self.overhead_s,
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
        """Read a model written by `to_json`; a wrong file says which key is missing or unknown."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
            coefficients = doc["coefficients"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: not a latency model file ({exc}); write one with "
                "`nightshift calibrate` or LatencyModel.to_json"
            ) from None
        expected = set(cls().coefficients())
        if set(coefficients) != expected:
            raise ValueError(
                f"{path}: coefficients must be exactly {sorted(expected)}, got {sorted(coefficients)}"
            )
        return cls(**{k: float(v) for k, v in coefficients.items()}, source=doc.get("source", {}))


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
    KV cache.
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

    Binary search, valid because step time never falls as a chunk grows (coefficients are
    non-negative); ~log2(max_chunk / granularity) model calls, cheap enough to run every decision.
    """
    if granularity < 1:
        raise ValueError(f"granularity must be >= 1, got {granularity}")

    def fits(units: int) -> bool:
        chunk = PrefillChunk(units * granularity, prefix_tokens)
        batch = StepBatch((chunk,), decode_seqs, decode_context_tokens)
        return model.step_seconds(batch) <= budget_s

    lo, hi = 0, max_chunk // granularity  # invariant: lo fits (0 trivially), hi+1 does not
    if hi == 0 or not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * granularity


# ---------------------------------------------------------------------------------------------
# Fitting to measured steps


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured engine step: what it carried and how long it took."""

    batch: StepBatch
    seconds: float


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well a fitted model reproduces its samples (errors in % of the measured step)."""

    samples: int
    mean_abs_pct_error: float
    p90_abs_pct_error: float
    max_abs_pct_error: float
    r2: float

    def to_dict(self) -> dict:
        return asdict(self)


_KNEE_CANDIDATES = 48


def fit(
    samples: list[StepSample], prior: LatencyModel | None = None
) -> tuple[LatencyModel, FitReport]:
    """Least-squares fit of the five coefficients to measured steps, all kept non-negative.

    The max() is handled exactly: for a knee K (= b/a) the linear part is a·max(T, K), linear in a,
    so each candidate knee is one non-negative least-squares problem and the best knee wins.
    Residuals are relative (divided by the measured time) so small decode steps count as much as
    long prefill steps: the controller needs both right. Terms the samples never exercise (no
    prefill at a prefix, no decode context) keep the prior's coefficient; a prior's knee is also
    tried first, so it wins ties when the samples cannot place the knee.
    """
    if len(samples) < 3:
        raise ValueError(f"fit needs at least 3 step samples, got {len(samples)}")
    features, y = _features(samples)
    if np.any(y <= 0):
        raise ValueError("every step sample needs seconds > 0; drop samples that were not timed")
    free = [j for j in range(3) if np.any(features[:, j + 1] > 0)]
    fixed = _prior_terms(prior, [j for j in range(3) if j not in free])
    top_tokens = float(features[:, 0].max())

    def solve(knee: float) -> tuple[float, np.ndarray]:
        # beyond the largest sample the samples cannot tell a·knee from overhead: keep prior's a
        per_token = prior.s_per_token if prior is not None and knee >= top_tokens else None
        return _solve_for_knee(features, y, knee, free, fixed, per_token)

    coarse = _knee_candidates(features[:, 0], prior)
    knee = _best_knee(coarse, solve)
    grid = sorted(set(coarse))
    i = grid.index(knee)
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 17)
    knee = _best_knee([knee, *fine.tolist()], solve)  # the coarse winner first: it keeps ties
    coef = solve(knee)[1]
    model = _model_from(coef, knee, free, fixed)
    report = _report(model, samples, y)
    model.source = {
        "kind": "fit",
        "samples": len(samples),
        "report": report.to_dict(),
        "prior": prior.source if prior is not None else None,
    }
    return model, report


def _features(samples: list[StepSample]) -> tuple[np.ndarray, np.ndarray]:
    """Columns: scheduled tokens, attention units, decode context tokens, 1 (overhead)."""
    rows = [
        (s.batch.total_tokens, attention_units(s.batch), s.batch.decode_context_tokens, 1.0)
        for s in samples
    ]
    return np.asarray(rows, dtype=float), np.asarray([s.seconds for s in samples], dtype=float)


def _prior_terms(prior: LatencyModel | None, missing: list[int]) -> dict[int, float]:
    """Coefficients of absent terms (0: attention, 1: decode context, 2: overhead) from the prior."""
    values = (
        (prior.s_per_attention_unit, prior.s_per_context_token, prior.overhead_s)
        if prior is not None
        else (0.0, 0.0, 0.0)
    )
    return {j: values[j] for j in missing}


def _best_knee(knees: list[float], solve: Callable[[float], tuple[float, np.ndarray]]) -> float:
    """The knee with the least squared error; the earliest wins a tie."""
    best_knee, best_sse = knees[0], solve(knees[0])[0]
    for knee in knees[1:]:
        sse = solve(knee)[0]
        if sse < best_sse * (1 - 1e-9):
            best_knee, best_sse = knee, sse
    return best_knee


def _knee_candidates(tokens: np.ndarray, prior: LatencyModel | None) -> list[float]:
    distinct = np.unique(tokens)
    picks = distinct[
        np.linspace(0, len(distinct) - 1, min(len(distinct), _KNEE_CANDIDATES)).astype(int)
    ]
    knees = [0.0, *(float(k) for k in picks[:-1])]  # a knee at the largest T leaves a unidentified
    if prior is not None and np.isfinite(prior.knee_tokens):
        knees.insert(0, prior.knee_tokens)
    return knees


def _solve_for_knee(
    features: np.ndarray,
    y: np.ndarray,
    knee: float,
    free: list[int],
    fixed: dict[int, float],
    per_token: float | None,
) -> tuple[float, np.ndarray]:
    """Relative-error NNLS for one knee; returns the squared error and [a, *free coefficients]."""
    linear = np.maximum(features[:, 0], knee)
    target = y - sum(fixed[j] * features[:, j + 1] for j in fixed)
    columns = [features[:, j + 1] for j in free]
    if per_token is None:
        columns.insert(0, linear)
    else:
        target = target - per_token * linear
    a = np.column_stack(columns) / y[:, None]
    b = target / y
    coef = nnls(a, b)
    residual = a @ coef - b
    if per_token is not None:
        coef = np.concatenate(([per_token], coef))
    return float(residual @ residual), coef


def _model_from(
    coef: np.ndarray, knee: float, free: list[int], fixed: dict[int, float]
) -> LatencyModel:
    terms = dict(fixed)
    terms.update({j: float(coef[i + 1]) for i, j in enumerate(free)})
    per_token = float(coef[0])
    return LatencyModel(
        s_per_token=per_token,
        s_weight_read=per_token * knee,
        s_per_attention_unit=terms[0],
        s_per_context_token=terms[1],
        overhead_s=terms[2],
    )


def _report(model: LatencyModel, samples: list[StepSample], y: np.ndarray) -> FitReport:
    predicted = np.array([model.step_seconds(s.batch) for s in samples])
    pct = 100.0 * np.abs(predicted - y) / y
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((predicted - y) ** 2)) / total if total > 0 else 1.0
    return FitReport(
        samples=len(samples),
        mean_abs_pct_error=float(pct.mean()),
        p90_abs_pct_error=float(np.percentile(pct, 90)),
        max_abs_pct_error=float(pct.max()),
        r2=r2,
    )


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """min ‖a·x − b‖ subject to x ≥ 0, by Lawson–Hanson active sets (few columns, so each pass
    is one small lstsq). Columns are scaled to unit norm first: the features span ten orders of
    magnitude (attention units vs the overhead column)."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > 1e-12)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        x = _feasible_step(a, b, x, passive)
    return x / norms


def _feasible_step(a: np.ndarray, b: np.ndarray, x: np.ndarray, passive: np.ndarray) -> np.ndarray:
    """Solve on the passive set; while that leaves it infeasible, step back to the boundary."""
    while True:
        z = np.zeros_like(x)
        z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
        if np.all(z[passive] > 0):
            return z
        blocking = np.flatnonzero(passive & (z <= 0))
        drop = x[blocking] - z[blocking]
        ratios = np.where(drop > 0, x[blocking] / np.where(drop > 0, drop, 1.0), 0.0)
        x = x + ratios.min() * (z - x)
        x[blocking[np.argmin(ratios)]] = 0.0  # exactly: the passive set must shrink each pass
        passive &= x > 1e-15
        if not passive.any():
            return np.zeros_like(x)
