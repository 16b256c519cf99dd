"""The control document: what a controller tells one replica's engine plug-in, and its checks.

The controller writes it, the plug-in applies it every step; both sides parse it here, so a
document the plug-in would reject is rejected by the writer first, with the same message. It is
small JSON with no optional meaning left to either side:

    {"format": "nightshift.control/1", "seq": 7, "expires_at": 1764621000.0,
     "batch_step_target_ms": 40.0, "min_chunk_tokens": 32, "pause": false,
     "latency_model": {"s_per_token": ..., ...the seven coefficients...}}

`seq` only grows: a document whose `seq` is not above the last applied one is stale and ignored.
`expires_at` (Unix seconds) bounds how long a silent controller stays in charge: past it the
plug-in pauses batch prefill. Parsing is pure; reading files and the clock is the caller's job.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from scheduler.latency_model import LatencyModel

FORMAT = "nightshift.control/1"
MAX_BYTES = 16 * 1024
"""Largest document accepted: a valid one is well under 1 KiB; anything larger is not ours."""


class ControlDocumentError(ValueError):
    """A control document that cannot be applied; the message names the field and the fix."""


@dataclass(frozen=True)
class ControlDocument:
    """One controller decision for one replica's engine."""

    seq: int
    """Grows with every document the controller writes; stale ones are ignored."""
    expires_at: float
    """Unix time after which the plug-in pauses batch prefill unless a newer document came."""
    batch_step_target_ms: float
    """Predicted engine-step time each batch prefill chunk is sized to fit, chat included."""
    latency_model: LatencyModel = field(default_factory=LatencyModel)
    """Step-time model the plug-in prices chunks with (the replica's fit, refitted as it runs)."""
    min_chunk_tokens: int = 0
    """Smallest batch chunk worth a step (except the one that ends a prefill)."""
    pause: bool = False
    """True: no batch prefill chunk at all; batch decodes and all chat go on."""
    idle_step_target_ms: float | None = None
    """Step time batch chunks fit while no chat request is in the engine (absent: the batch
    step target always): a chat arriving then waits at most this long for its prompt to start."""
    mean_step_target_ms: float | None = None
    """Mean step time batch chunks keep to while chat is in the engine (absent: every step is
    held to the batch step target); one step may run past it, up to the batch step target, on
    the time earlier steps left unused below it (`scheduler.step_budget.StepCredit`)."""
    chat_cache_horizon_s: float | None = None
    """How far back the plug-in counts chat's prefix-cache working set for its status (absent: it
    does not count it; `scheduler/chat_cache.py`)."""
    tail_scale: bool = True
    """True: the plug-in scales the model by the tail of its own error on batch steps
    (`scheduler/step_scale.py`), so a fixed target holds at the 99th percentile. False: it sizes
    to the model as sent, because the sender corrects the model from the status document's
    measured batch steps and holds chat's p99 by feedback (two corrections would fight)."""

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def to_json(self) -> str:
        doc = asdict(self)
        doc["latency_model"] = self.latency_model.coefficients()
        for key in ("idle_step_target_ms", "mean_step_target_ms", "chat_cache_horizon_s"):
            if doc[key] is None:
                del doc[key]
        if doc["tail_scale"]:
            del doc["tail_scale"]  # the default: documents of fixed targets read as before
        return json.dumps({"format": FORMAT, **doc}, sort_keys=True)


_FIELDS = {
    "format": str,
    "seq": int,
    "expires_at": float,
    "batch_step_target_ms": float,
    "latency_model": dict,
    "min_chunk_tokens": int,
    "pause": bool,
    "idle_step_target_ms": float,
    "mean_step_target_ms": float,
    "chat_cache_horizon_s": float,
    "tail_scale": bool,
}
_REQUIRED = ("seq", "expires_at", "batch_step_target_ms", "latency_model")


def parse(text: str | bytes) -> ControlDocument:
    """The document in `text`, or ControlDocumentError naming what is wrong."""
    if len(text) > MAX_BYTES:
        raise ControlDocumentError(f"document is {len(text)} bytes, more than {MAX_BYTES}")
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlDocumentError(f"not JSON: {exc}") from None
    except RecursionError:  # `[[[[...` within MAX_BYTES: the decoder's stack, not a ValueError
        raise ControlDocumentError("not JSON: nested too deep for a control document") from None
    return from_dict(raw)


def check_not_expired(doc: ControlDocument, now: float) -> None:
    """Raise ControlDocumentError for a document whose `expires_at` has passed by `now` (the
    receiver's clock): an old document replayed, or a sender whose clock is behind."""
    if doc.expired(now):
        raise ControlDocumentError(
            f"expired on arrival: expires_at {doc.expires_at:.3f} is {now - doc.expires_at:.1f} s "
            "before this host's clock; check the sender's clock, or send a fresh document"
        )


def from_dict(raw: object) -> ControlDocument:
    """Check every key and type of a decoded document; see `parse`."""
    if not isinstance(raw, dict):
        raise ControlDocumentError(f"must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ControlDocumentError(f"unknown key {unknown[0]!r}; known: {sorted(_FIELDS)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ControlDocumentError(f"missing key {missing[0]!r}")
    for key, value in raw.items():
        _check_type(key, value, _FIELDS[key])
    if raw.get("format", FORMAT) != FORMAT:
        raise ControlDocumentError(f"format {raw['format']!r}: this engine reads {FORMAT!r}")
    for key in (
        "seq",
        "expires_at",
        "batch_step_target_ms",
        "min_chunk_tokens",
        "idle_step_target_ms",
        "mean_step_target_ms",
        "chat_cache_horizon_s",
    ):
        if key in raw and not (raw[key] >= 0 and math.isfinite(raw[key])):
            raise ControlDocumentError(f"{key} must be a finite number >= 0, got {raw[key]}")
    return ControlDocument(
        seq=raw["seq"],
        expires_at=float(raw["expires_at"]),
        batch_step_target_ms=float(raw["batch_step_target_ms"]),
        latency_model=_latency_model(raw["latency_model"]),
        min_chunk_tokens=raw.get("min_chunk_tokens", 0),
        pause=raw.get("pause", False),
        idle_step_target_ms=(
            float(raw["idle_step_target_ms"]) if "idle_step_target_ms" in raw else None
        ),
        mean_step_target_ms=(
            float(raw["mean_step_target_ms"]) if "mean_step_target_ms" in raw else None
        ),
        chat_cache_horizon_s=(
            float(raw["chat_cache_horizon_s"]) if "chat_cache_horizon_s" in raw else None
        ),
        tail_scale=raw.get("tail_scale", True),
    )


def _check_type(key: str, value: object, kind: type) -> None:
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ControlDocumentError(
            f"{key} must be {kind.__name__}, got {type(value).__name__} {value!r:.40}"
        )


def _latency_model(raw: dict) -> LatencyModel:
    names = set(LatencyModel().coefficients())
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ControlDocumentError(
            f"latency_model: unknown coefficient {unknown[0]!r}; known: {sorted(names)}"
        )
    for key, value in raw.items():
        _check_type(f"latency_model.{key}", value, float)
    try:
        return LatencyModel(**{k: float(v) for k, v in raw.items()})
    except ValueError as exc:
        raise ControlDocumentError(f"latency_model: {exc}") from None
