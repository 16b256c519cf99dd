"""This machine's SLO, measured: chat alone for a while, then a multiple of what it got.

A shared CPU's speed varies from run to run, so a demo or a bench on one states its SLO from chat
measured now rather than from a fixed number (a GPU fleet states its own, e.g. 50 ms ITL p99). ITL
is never tighter than two full engine steps (bench.verdicts.itl_floor_ms says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.chat_load import ChatLoadSpec
from bench.chat_thread import ChatLoadThread
from bench.scoring import chat_latency
from bench.verdicts import engine_itl_floor_ms, slo_from_chat_only
from scheduler.slo import SLO
from scheduler.step import StepTimeModel
from serving.engine_config import EngineConfig


@dataclass(frozen=True)
class MeasuredSlo:
    """The SLO set from chat alone, with what it was set from."""

    slo: SLO
    chat_alone: dict
    """`bench.scoring.chat_latency` of the chat-alone run."""
    itl_floor_ms: float

    @property
    def floored(self) -> bool:
        """True when the ITL target is the two-step floor rather than the multiple of chat."""
        return self.slo.chat_itl_p99_ms == self.itl_floor_ms


def measure_slo(
    replicas: list[tuple[str, str]],
    config: EngineConfig,
    tokenizer,
    spec: ChatLoadSpec,
    run_id: str,
    model: StepTimeModel,
    factor: float = 3.0,
    window_s: float = 15.0,
) -> MeasuredSlo:
    """Play `spec` alone on `replicas` and set the SLO at `factor` × its p99s, per `window_s`."""
    alone = ChatLoadThread(replicas, config.model.served_name, tokenizer, spec, run_id)
    baseline = chat_latency(alone.start().join().records)
    floor = engine_itl_floor_ms(model, config.vllm)
    slo = slo_from_chat_only(baseline, factor=factor, window_s=window_s, itl_floor_ms=floor)
    return MeasuredSlo(slo, baseline, floor)
