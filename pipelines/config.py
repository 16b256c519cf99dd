"""Settings of one summarization run, validated up front so a typo fails before any work starts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PipelineConfig(BaseModel):
    """How documents are split, summarized and spread over workers."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "map_reduce", "whole"] = Field(
        "auto",
        description="`auto`: send a document whole when it fits the current chunk cap, else in "
        "sections; `whole`: whole whenever it fits the replica's context; `map_reduce`: always "
        "in sections.",
    )
    overlap_tokens: int = Field(64, ge=0, description="Tokens consecutive sections share.")
    min_section_tokens: int = Field(
        256,
        ge=1,
        description="Smallest section sent, even under a lower cap: below it the "
        "fixed cost per request dominates and a long document would take thousands of requests.",
    )
    section_summary_tokens: int = Field(96, ge=1, description="Output tokens per section summary.")
    final_summary_tokens: int = Field(192, ge=1, description="Output tokens of a document summary.")
    max_doc_tokens: int = Field(100_000, ge=1, description="Longer documents are failed, not cut.")
    max_model_len: int = Field(32_768, ge=256, description="The replica's context length.")
    ignore_eos: bool = Field(
        False,
        description="Generate exactly the requested tokens (the local random-weight models "
        "would otherwise stop at random).",
    )
    batch_stream_interval: int = Field(
        16,
        ge=1,
        description="Tokens per streamed chunk of a batch answer after its first (vLLM's "
        "`stream_interval`). Nobody reads batch tokens as they come, and every chunk costs the "
        "API server and the worker a message on the host chat shares; 1 streams every token "
        "and records batch ITL.",
    )
    attempts_per_request: int = Field(
        3, ge=1, description="Replicas a request may try when one dies under it."
    )
    actors: int = Field(2, ge=1, description="Ray Data summarizer actors.")
    docs_per_actor: int | None = Field(
        None,
        ge=1,
        description="Documents each actor works on at once (Ray Data's async UDF concurrency). "
        "None: enough for the actors together to fill every sequence slot of every replica "
        "(`docs_per_actor_for`).",
    )
    acquire_timeout_s: float = Field(
        3600.0, gt=0, description="Longest wait for a batch seat before a section fails."
    )

    def docs_per_actor_for(self, replicas: int, engine_slots: int) -> int:
        """Documents each actor works on at once beside `replicas` replicas that each run at most
        `engine_slots` sequences (vLLM's `max-num-seqs`).

        A document's sections go one after another, so the documents in flight bound the batch
        requests in flight: with fewer of them than the seats the Gate opens, the pool, not the
        SLO, caps batch throughput. (On `cpu-small` eight documents in flight held batch to eight
        seats; sixteen seats of the same size made 1.8× the tokens, at no worse ITL p99.)
        The engine never runs more than its slots, so that many per replica is always enough;
        documents beyond the seats wait at the Gate at the cost of their token ids in memory."""
        if self.docs_per_actor is not None:
            return self.docs_per_actor
        return max(1, -(-replicas * engine_slots // self.actors))
