"""The chat latency SLO the controller defends (docs/design.md §4.6)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SLO(BaseModel):
    """Chat latency targets. ITL percentiles are token-weighted, TTFT/E2E request-weighted, each
    computed per window of `window_s` seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chat_itl_p99_ms: float = Field(50.0, gt=0, description="Chat inter-token latency p99 target.")
    chat_ttft_p99_ms: float = Field(
        1000.0, gt=0, description="Chat time-to-first-token p99 target."
    )
    window_s: float = Field(60.0, gt=0, description="Length of one SLO evaluation window.")
    chat_e2e_p99_ms: float | None = Field(None, gt=0, description="Optional chat end-to-end p99.")
