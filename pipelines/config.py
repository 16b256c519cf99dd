"""Settings of one summarization run, validated up front so a typo fails before any work starts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PipelineConfig(BaseModel):
    """How documents are split, summarized and spread over workers.

    Whether a document goes whole or in sections, and where its sections are cut, follows from
    these settings and the document alone, never from the load at the moment it runs. The load is
    handled elsewhere: the Gate decides how many batch requests run at once, and the engine's
    scheduler plug-in sizes each step's batch prefill chunk, so a long prompt no longer needs to
    be cut small to protect chat. A fixed structure means the same document under the same job
    makes the same requests on a quiet night and a busy one (comparable runs, summaries that do
    not vary with the evening's traffic, and no storm of tiny sections at the chat peak)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "map_reduce", "whole"] = Field(
        "auto",
        description="`auto`: send a document whole when its prompt (instruction + document) plus "
        "its summary (`final_summary_tokens`) fit `max_model_len`, else map-reduce in sections of "
        "`section_tokens`; `whole`: always whole, and a document that does not fit the context "
        "is failed; `map_reduce`: always in sections of `section_tokens`. The choice depends on "
        "the document and these settings only, never on the chat load.",
    )
    section_tokens: int = Field(
        8192,
        ge=16,
        description="Document tokens per map-reduce section (the last one may be shorter), fixed "
        "for the job and never a function of the chat load: the engine sizes each step's batch "
        "prefill itself, so a section need not shrink when chat is busy. 8192 cuts an 80k-token "
        "document into ten sections (ten summaries and one reduce) while a section prompt stays "
        "a quarter of a 32k context. Where `max_model_len` cannot hold a section this large with "
        "its prompt and summary, sections are the largest that fit.",
    )
    overlap_tokens: int = Field(64, ge=0, description="Tokens consecutive sections share.")
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
    batch_cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[^@/\\\x00]+$",
        description="Prefix-cache salt of every batch request (vLLM's `cache_salt`): batch prompts "
        "reuse cached KV only from requests with the same salt. None shares the cache as usual. "
        "The benchmark gives each scenario its own, so that no scenario prefills less because an "
        "earlier one sent the same documents to the same engine.",
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

    @model_validator(mode="after")
    def _overlap_below_section(self) -> PipelineConfig:
        if self.overlap_tokens >= self.section_tokens:
            raise ValueError(
                f"overlap_tokens ({self.overlap_tokens}) must be below section_tokens "
                f"({self.section_tokens}): lower overlap_tokens or raise section_tokens"
            )
        return self

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
