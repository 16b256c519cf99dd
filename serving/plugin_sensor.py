"""Chat's own latency and the engine's step figures, from each replica's plug-in status document.

vLLM's latency histograms count batch tokens and batch prompts with chat's, and a chat waiting
behind a batch prefill produces no token at all; the engine plug-in keeps chat's own gaps and time
to first token apart (`serving/engine_site/engine_status.py`), so this sensor is how the controller
judges chat by chat's numbers. It also reports the measured/modelled step-time ratio of the steps
that carried a batch chunk, which the controller corrects its model with, and keeps one
`engine_steps` row per status document read.

Status documents are cumulative; a window is the difference between the newest and the newest at
least `window_s` older (or the oldest kept). A replica whose plug-in has written nothing (no
plug-in, or no step yet) is left out, so a merged sensor falls back to other latency sources; one
read once has no window yet and reports only what its engine has measured since it started.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping

from scheduler.admission import Observation
from serving.engine_control import ControlTarget, read_status
from serving.metrics import Histogram, histogram_delta, histogram_quantile


def status_histogram(doc: dict, key: str) -> Histogram:
    h = doc[key]
    return Histogram((*h["bounds"], float("inf")), tuple(h["cumulative"]), h["count"], h["sum"])


def window_figures(newer: dict, older: dict) -> dict:
    """Chat p99s and engine step figures between two status documents of one engine."""
    a, b = newer["totals"], older["totals"]
    steps = a["steps"] - b["steps"]
    batch_prefill = a["batch_prefill_tokens"] - b["batch_prefill_tokens"]
    batch_steps = a["batch_prefill_steps"] - b["batch_prefill_steps"]
    # A plug-in from before the count reports none: the share is then unknown, not 0.
    key = "target_bound_steps"
    bound = a[key] - b[key] if key in a and key in b else None
    return {
        "steps": steps,
        "chat_itl_p99_s": _window_p99(newer, older, "chat_itl_seconds"),
        "chat_ttft_p99_s": _window_p99(newer, older, "chat_ttft_seconds"),
        "chat_e2e_p99_s": _window_p99(newer, older, "chat_e2e_seconds"),
        "step_time_ratio": _batch_step_ratio(a, b),
        "mean_step_s": (a["measured_s"] - b["measured_s"]) / steps if steps else None,
        "batch_prefill_tokens": batch_prefill,
        "batch_tokens_per_step": batch_prefill / batch_steps if batch_steps else 0.0,
        "target_bound_steps": bound,
        "target_bound_share": bound / steps if bound is not None and steps else None,
    }


def engine_answer_tokens_p99(doc: dict) -> float | None:
    """The p99 length of every chat answer the engine has finished since it started (None before
    the first, or from a plug-in that does not count them): chat's own shape, which moves slowly,
    read over more answers than one window holds."""
    if "chat_answer_tokens" not in doc:
        return None
    return histogram_quantile(status_histogram(doc, "chat_answer_tokens"), 0.99)


def engine_step_ratio(doc: dict) -> float | None:
    """Measured over modelled time of every batch step the engine has timed since it started (None
    before the first): what the model is off by on this host, known before this run's first step."""
    return _batch_step_ratio(doc["totals"], {})


def _window_p99(newer: dict, older: dict, key: str) -> float | None:
    """The p99 of a status histogram between two documents; None where either lacks it (a
    plug-in from before the count)."""
    if key not in newer or key not in older:
        return None
    return histogram_quantile(
        histogram_delta(status_histogram(newer, key), status_histogram(older, key)), 0.99
    )


def _batch_step_ratio(totals: dict, since: dict) -> float | None:
    """Measured over modelled time of the steps that carried a batch chunk between two sets of
    totals: the model's error where chunks were sized. None without such a step (or from a
    plug-in that does not count them), which then says nothing about the model."""
    modelled = totals.get("batch_model_s", 0.0) - since.get("batch_model_s", 0.0)
    measured = totals.get("batch_measured_s", 0.0) - since.get("batch_measured_s", 0.0)
    return measured / modelled if modelled > 0 else None


class PluginStatusSensor:
    """Reads every replica's status document (folder or route) each time it is asked."""

    def __init__(
        self,
        targets: Mapping[str, ControlTarget],
        window_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.targets = dict(targets)
        self.window_s = window_s
        self.clock = clock
        self._history: dict[str, deque[dict]] = {name: deque() for name in self.targets}
        self.step_rows: list[dict] = []
        """One row per new status document: the run's `engine_steps` table."""
        self.latest: dict[str, dict] = {}
        """Each replica's newest status document read."""

    async def observe(self) -> dict[str, Observation]:
        names = list(self.targets)
        docs = await asyncio.gather(
            *(asyncio.to_thread(read_status, self.targets[n]) for n in names)
        )
        t = self.clock()
        out = {}
        for name, doc in zip(names, docs, strict=True):
            obs = self._observation(name, doc, t)
            if obs is not None:
                out[name] = obs
        return out

    def _observation(self, name: str, doc: dict | None, t: float) -> Observation | None:
        history = self._history[name]
        if doc is None:
            return None
        self.latest[name] = doc
        if not history or doc["written_at"] > history[-1]["written_at"]:
            if history:
                self._row(name, doc, history[-1])
            history.append(doc)
        newest, start = history[-1], self._start(history)
        lifetime = {"engine_step_time_ratio": engine_step_ratio(newest),
                    "chat_answer_tokens_p99": engine_answer_tokens_p99(newest),
                    "chat_cache_tokens": newest.get("chat_cache_tokens")}  # fmt: skip
        if start is None:  # one document: no window yet, but the engine's record already stands
            return Observation(t=t, replica=name, **lifetime)
        f = window_figures(newest, start)
        return Observation(
            t=t,
            replica=name,
            chat_itl_p99_s=f["chat_itl_p99_s"],
            chat_ttft_p99_s=f["chat_ttft_p99_s"],
            chat_e2e_p99_s=f["chat_e2e_p99_s"],
            step_time_ratio=f["step_time_ratio"],
            target_bound_share=f["target_bound_share"],
            window_s=t - start["written_at"],
            **lifetime,
        )

    def _start(self, history: deque[dict]) -> dict | None:
        if len(history) < 2:
            return None
        if self.window_s is None:
            return history[-2]
        newest = history[-1]["written_at"]
        while len(history) > 2 and newest - history[1]["written_at"] >= self.window_s:
            history.popleft()
        return history[0]

    def _row(self, name: str, doc: dict, before: dict) -> None:
        f = window_figures(doc, before)
        self.step_rows.append({
            "t": doc["written_at"],
            "replica": name,
            "state": doc.get("state"),
            "control_seq": doc.get("control_seq"),
            "batch_step_target_ms": doc.get("batch_step_target_ms"),
            "steps": f["steps"],
            "mean_step_ms": None if f["mean_step_s"] is None else 1000 * f["mean_step_s"],
            "step_time_ratio": f["step_time_ratio"],
            "batch_prefill_tokens": f["batch_prefill_tokens"],
            "batch_tokens_per_step": f["batch_tokens_per_step"],
            "chat_itl_p99_s": f["chat_itl_p99_s"],
            "target_bound_steps": f["target_bound_steps"],
            "chat_cache_tokens": doc.get("chat_cache_tokens"),
        })  # fmt: skip
