"""Model and GPU specs: the numbers the planner and the roofline latency model reason with.

The numbers live in `scheduler/specs/*.yaml`, each entry with its source, so that checking or
adding a model or GPU is a data change. This module loads and validates them once and hands out
frozen dataclasses in base units (bytes, bytes/s, FLOP/s), so no caller converts units.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SPECS_DIR = Path(__file__).with_name("specs")
MODELS_FILE = SPECS_DIR / "models.yaml"
GPUS_FILE = SPECS_DIR / "gpus.yaml"

E = TypeVar("E", bound=BaseModel)

DTYPE_BYTES: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp32": 4.0,
}  # fmt: skip
"""Bytes per stored value. int4 ignores group scales (~3% more in real checkpoints); fp32 is for
CPU replicas without native bf16, whose steps are priced by their fit, not by a roofline."""


class SpecError(ValueError):
    """A spec file or a spec name that cannot be used; the message says what to change."""


class ModelShape(BaseModel):
    """The shape numbers of a decoder-only transformer (Llama family), declared once: the spec
    table's entries, `ModelSpec` and an engine config's `model.architecture` all take these."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(gt=0, description="Transformer layers (num_hidden_layers).")
    hidden: int = Field(gt=0, description="Hidden size (hidden_size).")
    intermediate: int = Field(gt=0, description="MLP intermediate size (intermediate_size).")
    heads: int = Field(gt=0, description="Query heads (num_attention_heads).")
    kv_heads: int = Field(gt=0, description="Key/value heads, GQA (num_key_value_heads).")
    head_dim: int = Field(gt=0, description="Dimension of one attention head.")
    params: int = Field(gt=0, description="Total parameter count.")
    vocab: int = Field(gt=0, description="Vocabulary size (vocab_size).")


SHAPE_FIELDS: tuple[str, ...] = tuple(ModelShape.model_fields)


class ModelSpec(ModelShape):
    """A model of the spec table: its shape, its context length, where it comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    max_position: int = Field(gt=0, description="max_position_embeddings.")
    path: str = ""
    source: str = ""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator in base units: bytes, bytes/s and dense FLOP/s."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    interconnect_bytes_per_s: float
    hourly_usd: float = 0.0
    source: str = ""

    def matmul_flops(self, weight_dtype: str) -> float:
        """Dense FLOP/s for the linear layers: FP8 weights use the FP8 tensor cores (W8A8); 16-bit
        and weight-only int8/int4 weights are dequantized and multiply at the BF16 rate."""
        dtype_bytes(weight_dtype)
        if weight_dtype == "fp32":
            raise SpecError(
                "fp32 weights: the GPU table has no FP32 matmul rate to price them by; fit the "
                "replica's steps (`nightshift calibrate`) and pass the fit"
            )
        return self.fp8_flops if weight_dtype == "fp8" else self.bf16_flops


class _ModelEntry(ModelShape):
    path: str = Field(description="Engine config model.path: a hub id or `local:NAME`.")
    max_position: int = Field(gt=0, description="max_position_embeddings.")
    source: str = Field(min_length=1, description="Where these numbers come from.")


class _GpuEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory_gb: float = Field(gt=0, description="Device memory, decimal GB.")
    memory_bandwidth_tb_s: float = Field(gt=0, description="Memory bandwidth, TB/s.")
    bf16_dense_tflops: float = Field(gt=0, description="Dense BF16 tensor TFLOPS.")
    fp8_dense_tflops: float = Field(gt=0, description="Dense FP8 tensor TFLOPS.")
    interconnect_gb_s: float = Field(gt=0, description="GPU-to-GPU bandwidth, GB/s.")
    hourly_usd: float = Field(0.0, ge=0, description="Assumed price of one GPU-hour.")
    source: str = Field(min_length=1, description="Where these numbers come from.")


def load_models(path: str | Path = MODELS_FILE) -> dict[str, ModelSpec]:
    """All model specs in `path`, validated; errors name the file, the entry and the field."""
    entries = _load_entries(Path(path), _ModelEntry)
    specs = {name: ModelSpec(name=name, **entry.model_dump()) for name, entry in entries.items()}
    for spec in specs.values():
        if spec.heads % spec.kv_heads:
            raise SpecError(
                f"{path}: {spec.name}: heads ({spec.heads}) must be a multiple of kv_heads "
                f"({spec.kv_heads})"
            )
    return specs


def load_gpus(path: str | Path = GPUS_FILE) -> dict[str, GpuSpec]:
    """All GPU specs in `path`, validated and converted to base units."""
    entries = _load_entries(Path(path), _GpuEntry)
    return {name: _gpu_from_entry(name, entry) for name, entry in entries.items()}


def _gpu_from_entry(name: str, e: _GpuEntry) -> GpuSpec:
    return GpuSpec(
        name=name,
        memory_bytes=e.memory_gb * 1e9,
        hbm_bytes_per_s=e.memory_bandwidth_tb_s * 1e12,
        bf16_flops=e.bf16_dense_tflops * 1e12,
        fp8_flops=e.fp8_dense_tflops * 1e12,
        interconnect_bytes_per_s=e.interconnect_gb_s * 1e9,
        hourly_usd=e.hourly_usd,
        source=e.source,
    )


def _load_entries(path: Path, entry_type: type[E]) -> dict[str, E]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read spec file: {exc}") from exc
    if not isinstance(raw, dict) or not raw:
        raise SpecError(f"{path}: expected a mapping of name -> entry")
    entries: dict[str, E] = {}
    for name, body in raw.items():
        try:
            entries[str(name)] = entry_type.model_validate(body)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(entry)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise SpecError(f"{path}: entry {name!r}: {problems}") from None
    return entries


@cache
def _models() -> dict[str, ModelSpec]:
    return load_models()


@cache
def _gpus() -> dict[str, GpuSpec]:
    return load_gpus()


def known_models() -> list[str]:
    """Model names `model_spec` accepts."""
    return list(_models())


def known_gpus() -> list[str]:
    """GPU names `gpu_spec` accepts."""
    return list(_gpus())


def model_spec(name: str) -> ModelSpec:
    """The spec of model `name`; an unknown name raises `SpecError` listing the known ones."""
    try:
        return _models()[name]
    except KeyError:
        raise SpecError(
            f"unknown model {name!r}; known models: {', '.join(known_models())} "
            f"(add one to {MODELS_FILE})"
        ) from None


GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb"}
"""Short names people type for the form factor the spec table prices by default."""


def gpu_name(name: str) -> str:
    """The spec table's name for `name`: itself, or the GPU its alias stands for."""
    key = name.strip().lower()
    return GPU_ALIASES.get(key, key)


def gpu_spec(name: str) -> GpuSpec:
    """The spec of GPU `name` (or an alias: `h100` is `h100-sxm`); an unknown name raises
    `SpecError` listing the known ones."""
    try:
        return _gpus()[gpu_name(name)]
    except KeyError:
        raise SpecError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(known_gpus())} (aliases: "
            f"{', '.join(f'{a} = {n}' for a, n in GPU_ALIASES.items())}; add one to {GPUS_FILE})"
        ) from None


def dtype_bytes(name: str) -> float:
    """Bytes per value of dtype `name` (`bf16`, `fp16`, `fp8`, `int8`, `int4`)."""
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise SpecError(f"unknown dtype {name!r}; known dtypes: {', '.join(DTYPE_BYTES)}") from None


def count_params(spec: ModelSpec) -> int:
    """Parameters implied by the shape of a Llama-style model with an untied lm_head: the check
    that a `params` figure in the data file belongs to the shape next to it."""
    q_width = spec.heads * spec.head_dim
    kv_width = spec.kv_heads * spec.head_dim
    attention = spec.hidden * (2 * q_width + 2 * kv_width)
    mlp = 3 * spec.hidden * spec.intermediate
    per_layer = attention + mlp + 2 * spec.hidden
    return 2 * spec.vocab * spec.hidden + spec.layers * per_layer + spec.hidden
