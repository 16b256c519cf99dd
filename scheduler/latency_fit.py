"""Fitting the step-time model (`scheduler.latency_model`) to measured engine steps.

A relative-error non-negative least squares over the seven coefficients, exact about the max() of
the linear part by searching its knee. Kept apart from the model because the planner, simulator
and controller only predict; calibration (`serving.calibration`) is the one place that fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from scheduler.latency_model import LatencyModel, attention_units, chunk_prefix_tokens
from scheduler.step import StepBatch


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
_TERMS = (
    "s_per_attention_unit",
    "s_per_context_token",
    "overhead_s",
    "s_per_chunk_prefix_token",
    "s_per_decode_seq",
)
"""The coefficients beside a and b, in the order of their feature columns after scheduled tokens."""


def fit(
    samples: list[StepSample], prior: LatencyModel | None = None
) -> tuple[LatencyModel, FitReport]:
    """Least-squares fit of the seven coefficients to measured steps, all kept non-negative.

    The max() is handled exactly: for a knee K (= b/a) the linear part is a·max(T, K), linear in a,
    so each candidate knee is one non-negative least-squares problem and the best knee wins.
    Residuals are relative (divided by the measured time) so small decode steps count as much as
    long prefill steps: the controller needs both right. Terms the samples never exercise (no
    prefill at all or none at a prefix, no decode sequence or context) keep the prior's coefficient;
    a prior's knee is also tried first, so it wins ties when the samples cannot place the knee.

    Decode sequences count twice, in T and in g·B: steps with prefill chunks (tokens in T, none
    in B) are what tell a from g, so a sweep of decodes alone leaves the two confounded.
    """
    if len(samples) < 3:
        raise ValueError(f"fit needs at least 3 step samples, got {len(samples)}")
    features, y = _features(samples)
    if np.any(y <= 0):
        raise ValueError("every step sample needs seconds > 0; drop samples that were not timed")
    free = [j for j in range(len(_TERMS)) if np.any(features[:, j + 1] > 0)]
    fixed = _prior_terms(prior, [j for j in range(len(_TERMS)) if j not in free])
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
    """Columns: scheduled tokens, then the feature of each of `_TERMS`."""
    rows = [(s.batch.total_tokens, *_term_features(s.batch)) for s in samples]
    return np.asarray(rows, dtype=float), np.asarray([s.seconds for s in samples], dtype=float)


def _term_features(batch: StepBatch) -> tuple[float, ...]:
    """What each of `_TERMS` multiplies in `LatencyModel.step_seconds`."""
    return (
        attention_units(batch),
        batch.decode_context_tokens,
        1.0,
        chunk_prefix_tokens(batch),
        batch.decode_seqs,
    )


def _prior_terms(prior: LatencyModel | None, missing: list[int]) -> dict[int, float]:
    """Coefficients of the terms the samples leave unexercised (indices into `_TERMS`): the
    prior's, or 0 without one."""
    return {j: getattr(prior, _TERMS[j]) if prior is not None else 0.0 for j in missing}


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
        **{name: terms[j] for j, name in enumerate(_TERMS)},
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
