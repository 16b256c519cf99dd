"""What a calibration sweep measures, bounded by what the replica allows.

Step time depends on the decode batch (sequences and their total context) and on prefill chunks
(size and prefix position), docs/design.md §4.2. The sweep therefore has two parts: decode shapes (B streams
at context L) and chunk shapes (one chunk of C tokens at prefix p, beside B decoding streams).
Everything is bounded by the replica's limits (max-model-len, max-num-seqs, step budget, KV
capacity); what does not fit is dropped with a reason the command prints, never silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.engine_config import EngineConfig


class CalibrationError(ValueError):
    """A replica or sweep that cannot be calibrated; the message says what to change."""


@dataclass(frozen=True)
class SweepConfig:
    """How much to measure. The default takes a few minutes on cpu-small; `QUICK` is for tests."""

    decode_seqs: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Decode batch sizes B of the decode shapes."""
    decode_contexts: tuple[int, ...] = (128, 2048, 8192)
    """Prompt lengths L of the decode shapes (each stream's context)."""
    decode_steps: int = 64
    """Decode steps a decode shape times (the difference between its long and short runs)."""
    chunk_decode_seqs: tuple[int, ...] = (0, 4)
    """Decoding streams beside each measured chunk (0: the chunk alone in its step)."""
    chunk_prefixes: tuple[int, ...] = (0, 2048, 8192, 16384, 24576, 49152, 79872)
    """Prefix positions p the chunks start at (capped by max-model-len, so a 32k replica measures
    its deepest once): as deep as an 80k-token document reaches, where a fit would otherwise
    extrapolate the per-position costs far past its samples."""
    chunk_sizes: tuple[int, ...] = (64, 256, 512)
    """Chunk sizes C (capped by what one step can take beside the decodes)."""
    repeats: int = 3
    """Passes over the sweep, each running every shape once; a sample is the fastest run."""
    decoder_prompt_tokens: int = 64
    """Prompt of each decoding stream beside the chunks (short: it is not what is measured)."""
    kv_headroom: float = 0.8
    """Share of the KV pool a shape may fill, so the engine never preempts during a measurement."""


QUICK = SweepConfig(
    decode_seqs=(1, 4, 8),
    decode_contexts=(64, 1024),
    decode_steps=64,
    chunk_decode_seqs=(0,),
    chunk_prefixes=(0, 1024, 2048, 3072),
    chunk_sizes=(64, 256, 512),
    repeats=4,
)
"""A sweep of ~10 s on cpu-tiny (plus the replica's start): 6 decode and 12 chunk shapes."""


@dataclass(frozen=True)
class EngineLimits:
    """The engine settings a sweep must respect."""

    step_tokens: int
    """max-num-batched-tokens: scheduled tokens per step."""
    long_prefill_threshold: int = 0
    """long-prefill-token-threshold: cap on one prompt's chunk (0: none)."""
    max_model_len: int = 4096
    """Longest sequence, prompt plus output."""
    max_num_seqs: int = 256
    """Most sequences running at once."""
    kv_capacity_tokens: int | None = None
    """Tokens the KV pool holds; None when unknown (then only max-model-len bounds shapes)."""

    def max_chunk(self, decode_seqs: int) -> int:
        """Largest chunk one step takes beside `decode_seqs` decodes: running decodes are scheduled
        first and take one token of the budget each; the prompt gets the rest, up to the threshold."""
        chunk = self.step_tokens - decode_seqs
        if self.long_prefill_threshold > 0:
            chunk = min(chunk, self.long_prefill_threshold)
        return chunk


def engine_limits(config: EngineConfig, kv_capacity_tokens: int | None) -> EngineLimits:
    """Read the limits from an engine config. The step budget and max-model-len must be explicit
    (engine defaults vary by version and device, and every shape is sized by them), and prefix
    caching must be on: it is how a chunk is placed at a prefix and a decode shape skips its prefill."""
    missing = [k for k in ("max-num-batched-tokens", "max-model-len") if config.flag(k) is None]
    if missing:
        raise CalibrationError(
            f"engine config {config.name}: set vllm: {', '.join(missing)}; calibration sizes every "
            "measured step by them"
        )
    if config.flag("enable-prefix-caching", True) is False:
        raise CalibrationError(
            f"engine config {config.name}: calibration needs vllm: enable-prefix-caching: true "
            "to place chunks at a prefix position in a single step"
        )
    return EngineLimits(
        step_tokens=int(config.flag("max-num-batched-tokens")),
        long_prefill_threshold=int(config.flag("long-prefill-token-threshold", 0)),
        max_model_len=int(config.flag("max-model-len")),
        max_num_seqs=int(config.flag("max-num-seqs", 256)),
        kv_capacity_tokens=kv_capacity_tokens,
    )


@dataclass(frozen=True)
class DecodeShape:
    """B streams of L-token prompts decoding together."""

    seqs: int
    context: int


@dataclass(frozen=True)
class ChunkGroup:
    """Chunks of the given sizes, each prefilled alone at `prefix`, beside `decode_seqs` decodes."""

    decode_seqs: int
    prefix: int
    sizes: tuple[int, ...]


@dataclass
class SweepPlan:
    """The shapes to measure, in order, and the ones dropped with why."""

    limits: EngineLimits
    sweep: SweepConfig
    decode: list[DecodeShape] = field(default_factory=list)
    chunks: list[ChunkGroup] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def decoder_tokens(self) -> int:
        """Output of each stream that decodes beside the chunks: more steps than one run of a
        group takes (the stream is cancelled when the run is done), within max-model-len."""
        return min(8192, self.limits.max_model_len - self.sweep.decoder_prompt_tokens - 1)


def plan_sweep(limits: EngineLimits, sweep: SweepConfig) -> SweepPlan:
    """Every shape of `sweep` that fits `limits`, shrunk where the sweep allows it."""
    plan = SweepPlan(limits, sweep)
    for context in sweep.decode_contexts:  # context outer: a shape reuses the last one's prompts
        for seqs in sorted(sweep.decode_seqs):
            _add_decode(plan, seqs, context)
    for seqs in sweep.chunk_decode_seqs:
        for prefix in sweep.chunk_prefixes:
            _add_chunks(plan, seqs, prefix)
    return plan


def _add_decode(plan: SweepPlan, seqs: int, context: int) -> None:
    limits = plan.limits
    if seqs > limits.max_num_seqs:
        plan.skipped.append(f"decode B={seqs}: above max-num-seqs {limits.max_num_seqs}")
        return
    context = min(context, limits.max_model_len - plan.sweep.decode_steps - 2)
    need = seqs * (context + plan.sweep.decode_steps + 1)
    if context < 1:
        plan.skipped.append(f"decode B={seqs}: max-model-len {limits.max_model_len} too short")
    elif not _fits_kv(plan, need):
        plan.skipped.append(f"decode B={seqs} L={context}: {need} KV tokens exceed the headroom")
    elif DecodeShape(seqs, context) not in plan.decode:
        plan.decode.append(DecodeShape(seqs, context))


def _add_chunks(plan: SweepPlan, seqs: int, prefix: int) -> None:
    limits = plan.limits
    if seqs + 1 > limits.max_num_seqs:
        plan.skipped.append(f"chunks beside B={seqs}: above max-num-seqs {limits.max_num_seqs}")
        return
    largest = limits.max_chunk(seqs)
    sizes = tuple(sorted({min(c, largest) for c in plan.sweep.chunk_sizes if largest >= 1}))
    prefix = min(prefix, limits.max_model_len - max(sizes, default=0) - 1)
    need = (
        prefix
        + max(sizes, default=0)
        + seqs * (plan.sweep.decoder_prompt_tokens + plan.decoder_tokens)
    )
    if not sizes or prefix < 0:
        plan.skipped.append(f"chunks beside B={seqs}: no room in max-model-len or the step budget")
    elif not _fits_kv(plan, need):
        plan.skipped.append(f"chunks at p={prefix} beside B={seqs}: exceed the KV headroom")
    elif all((g.decode_seqs, g.prefix) != (seqs, prefix) for g in plan.chunks):
        plan.chunks.append(ChunkGroup(seqs, prefix, sizes))


def _fits_kv(plan: SweepPlan, tokens: int) -> bool:
    capacity = plan.limits.kv_capacity_tokens
    return capacity is None or tokens <= capacity * plan.sweep.kv_headroom
