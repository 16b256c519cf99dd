"""The real half of the fidelity check: a mixed chat + batch workload on a live replica.

Chat is the production-shaped load of `bench.chat_load`. Batch is deliberately plain: `seats`
closed-loop workers, each sending one long prompt of exactly `doc_tokens` token ids at batch
priority and asking for `output_tokens` tokens, then the next, until the time is up. Plain, because
the question here is whether the simulator's *replica* behaves like the real one; the pipeline's
map-reduce has tests of its own. Everything the simulator needs to replay the same work is kept:
each chat request's arrival, prompt and output length, and the engine's ITL histograms. With the
engine plug-in steering (a control document at a fixed batch step target), the plug-in's chat-only
token gaps over the measured run are kept too: that is how chat is judged once batch is steered.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.chat_load import ChatLoadSpec, model_text
from bench.chat_thread import ChatLoadThread
from scheduler.records import RequestRecord
from serving.client import BATCH_PRIORITY, StreamingClient
from serving.engine_itl import EngineItlRecorder, HistogramSeries
from serving.engine_site.engine_status import WRITE_EVERY_S
from serving.metrics import Histogram, histogram_delta
from serving.plugin_sensor import status_histogram


@dataclass(frozen=True)
class MixedWorkload:
    """What runs for `duration_s`: chat at `chat.rate`, and `seats` batch prompts at a time."""

    chat: ChatLoadSpec
    duration_s: float = 120.0
    """Seconds of mixed load."""
    seats: int = 2
    """Batch prompts in flight at once (closed loop)."""
    doc_tokens: int = 6000
    """Prompt tokens of every batch request."""
    output_tokens: int = 64
    """Tokens every batch request generates (ignore_eos: exactly this many)."""
    seed: int = 0
    warmup_s: float = 30.0
    """Seconds of the same load run first and not measured (see `run_real`)."""


@dataclass
class RealRun:
    """What the replica did: request records, the span they are judged over, the engine's ITL."""

    t0: float
    t1: float
    chat: list[RequestRecord]
    batch: list[RequestRecord]
    engine_itl: HistogramSeries = field(default_factory=HistogramSeries)
    chat_itl: Histogram | None = None
    """Chat's own token gaps over the run, from the plug-in's status (None: no status read)."""
    step_time_ratio: float | None = None
    """The engine's measured step time over the latency model's over the run, from the plug-in's
    status: how far the fit is off on this host now (None: no status, or no step priced)."""
    request_overhead_s: float | None = None
    """Chat's mean time to first token at the client over its mean inside the engine (the
    plug-in's status): what the API server adds to every request (None: no status)."""
    steps: list = field(default_factory=list)
    """The engine's steps of the measured run as the plug-in timed them (`StepSample`s; empty
    without a step log)."""


def run_real(
    workload: MixedWorkload,
    replica: tuple[str, str],
    model: str,
    tokenizer,
    plugin_status: Callable[[], dict | None] | None = None,
    step_log: Path | None = None,
) -> RealRun:
    """Run `workload` against one replica and return its records; `plugin_status` reads the
    replica's plug-in status document, whose chat-only gaps are then kept for the measured run;
    `step_log` is the replica's step log (`STEP_LOG_ENV`), whose measured run's steps are kept.

    A fresh CPU engine is slow for its first tens of seconds of mixed load (every new step shape
    builds its kernels once: measured here, a 6k-token prompt took 10 s in the first 20 s of a run
    and under 1 s after), which a simulator of the warm engine rightly does not model. So the same
    load runs `warmup_s` first, with another seed, and only the run after it is measured.
    """
    if workload.warmup_s > 0:
        warm = replace(
            workload,
            duration_s=workload.warmup_s,
            warmup_s=0.0,
            seed=workload.seed + 1,  # other batch prompts: none may be a prefix-cache hit later
            chat=replace(workload.chat, seed=workload.chat.seed + 1),
        )
        run_real(warm, replica, model, tokenizer)
    chat_spec = replace(workload.chat, duration_s=workload.duration_s)
    before = plugin_status() if plugin_status else None
    logged_before = _lines(step_log)
    with EngineItlRecorder([replica]) as engine:
        t0 = time.time()
        chat = ChatLoadThread([replica], model, tokenizer, chat_spec, "fidelity-real").start()
        batch = asyncio.run(_batch_load(workload, replica, model, tokenizer, t0))
        chat_records = chat.join().records
    if plugin_status is not None:
        time.sleep(WRITE_EVERY_S + 0.2)  # the next status write covers the run's last steps
    after = plugin_status() if plugin_status else None
    chat_itl = ratio = overhead = None
    if after is not None:
        chat_itl = _status_delta(after, before, "chat_itl_seconds")
        ratio = model_error(after, before)
        overhead = request_overhead(chat_records, _status_delta(after, before, "chat_ttft_seconds"))
    return RealRun(
        t0, t0 + workload.duration_s, chat_records, batch, engine.series, chat_itl, ratio,
        overhead, _steps_after(step_log, logged_before),
    )  # fmt: skip


def _status_delta(after: dict, before: dict | None, key: str) -> Histogram:
    return histogram_delta(
        status_histogram(after, key), None if before is None else status_histogram(before, key)
    )


def request_overhead(chat: list[RequestRecord], engine_ttft: Histogram) -> float | None:
    """Mean client TTFT of the chat requests that got a first token, over the engine's mean TTFT
    of chat in the same span; never below 0. None without both."""
    client = [r.ttft_s for r in chat if r.ttft_s is not None]
    if not client or engine_ttft.count <= 0:
        return None
    return max(0.0, sum(client) / len(client) - engine_ttft.sum / engine_ttft.count)


def _lines(path: Path | None) -> int:
    if path is None or not path.is_file():
        return 0
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


def _steps_after(path: Path | None, skip: int) -> list:
    """The steps logged after the first `skip` lines."""
    from serving.step_samples import read_samples

    return read_samples(path)[skip:] if path is not None and path.is_file() else []


def model_error(after: dict, before: dict | None) -> float | None:
    """Measured over modelled step seconds between two plug-in status documents (`before` None:
    since the engine started); None when no step was priced in between."""
    a, b = after["totals"], (before or {}).get("totals", {})
    modelled = a.get("model_s", 0.0) - b.get("model_s", 0.0)
    measured = a["measured_when_predicted_s"] - b.get("measured_when_predicted_s", 0.0)
    return measured / modelled if modelled > 0 else None


async def _batch_load(
    workload: MixedWorkload, replica: tuple[str, str], model: str, tokenizer, t0: float
) -> list[RequestRecord]:
    ids = tokenizer.encode(model_text())
    if len(ids) < workload.doc_tokens + 1:
        ids = ids * (workload.doc_tokens // max(len(ids), 1) + 2)
    rng = random.Random(f"{workload.seed}:batch")
    records: list[RequestRecord] = []
    name, url = replica

    async def worker(client: StreamingClient) -> None:
        while time.time() < t0 + workload.duration_s:
            start = rng.randrange(len(ids) - workload.doc_tokens)
            done = await client.complete(
                ids[start : start + workload.doc_tokens],
                max_tokens=workload.output_tokens,
                cls="batch",
                stage="map",
                priority=BATCH_PRIORITY,
                ignore_eos=True,
            )
            records.append(done.record)

    async with StreamingClient(url, model, run_id="fidelity-real", replica=name) as client:
        tasks = [asyncio.create_task(worker(client)) for _ in range(workload.seats)]
        await asyncio.sleep(max(0.0, t0 + workload.duration_s - time.time()))
        for t in tasks:
            t.cancel()  # a request cut at the end is aborted by the engine when its stream closes
        await asyncio.gather(*tasks, return_exceptions=True)
    return records
