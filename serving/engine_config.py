"""Engine config files (`engine_configs/*.yaml`): schema, loading with clear errors, flag rendering.

One YAML per replica class. The `vllm:` mapping is passed to the engine as command-line flags, with
the dash-form keys `vllm serve --config` takes, so a config reads like the engine's own docs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler.budget_controller import BudgetControllerConfig
from scheduler.specs import ModelShape

FlagValue = bool | int | float | str | list[str | int | float] | dict[str, list[float]]

LOCAL_MODEL_PREFIX = "local:"


class EngineConfigError(ValueError):
    """An engine config that cannot be used; the message names the file and the key."""


class Architecture(ModelShape):
    """Model shape numbers the capacity planner and latency model need (`scheduler.specs`)."""


class ModelSection(BaseModel):
    """Which model the replica serves."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="A model directory, a hub id, or `local:NAME` for a locally built model."
    )
    served_name: str = Field(description="Name clients put in the request's `model` field.")
    spec: str | None = Field(None, description="Name of a model in the planner's spec table.")
    architecture: Architecture | None = Field(None, description="Shape numbers for the planner.")

    @property
    def local_name(self) -> str | None:
        """`tiny` for `local:tiny`, None for any other path."""
        if self.path.startswith(LOCAL_MODEL_PREFIX):
            return self.path[len(LOCAL_MODEL_PREFIX) :]
        return None


class HardwareSection(BaseModel):
    """What one replica runs on and what it costs; used by cost reports and the planner."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["cpu", "gpu"] = Field("cpu", description="Device kind.")
    gpu_type: str | None = Field(None, description="GPU name in the planner's spec table.")
    count: int = Field(1, gt=0, description="GPUs (or CPU sockets) per replica.")
    hourly_usd: float = Field(0.0, ge=0, description="Price of one replica-hour, all devices.")


class EngineConfig(BaseModel):
    """One replica class: model, hardware, engine flags and environment."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Replica class name, used in logs, records and reports.")
    model: ModelSection
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    vllm: dict[str, FlagValue] = Field(default_factory=dict, description="Engine flags.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine environment variables.")
    latency_fit: str | None = Field(
        None,
        description="The latency fit the engine plug-in and the controller price steps with "
        "(`nightshift calibrate` writes one), relative to this file; default "
        "`fits/<name>.json`. `run`, `engine budget` and the Prefect flow take it unless "
        "`--latency-model` is given.",
    )
    controller: BudgetControllerConfig | None = Field(
        None,
        description="SLO controller tuning for this replica class (keys of "
        "`scheduler.budget_controller.BudgetControllerConfig`); the Gate uses it unless a run "
        "sets its own.",
    )

    @field_validator("vllm")
    @classmethod
    def _dash_form_keys(cls, flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
        for key in flags:
            if "_" in key or key.startswith("-"):
                raise ValueError(
                    f"flag {key!r}: write engine flags in dash form without leading dashes, "
                    f"e.g. {key.strip('-').replace('_', '-')!r}"
                )
            if key in ("model", "port", "host", "served-model-name"):
                raise ValueError(
                    f"flag {key!r} is set by the launcher: use the config's model section or "
                    "`--port` instead"
                )
        return flags

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_strings(cls, env: object) -> object:
        if isinstance(env, dict):
            return {k: str(v) for k, v in env.items()}
        return env

    def flag(self, key: str, default: FlagValue | None = None) -> FlagValue | None:
        """The value of engine flag `key` (dash form), or `default`."""
        return self.vllm.get(key, default)

    @property
    def sequence_slots(self) -> int:
        """Most sequences the engine runs at once (`max-num-seqs`). Unset, vLLM picks by device
        (128 to 1024); 256, its default on most GPUs, stands in: set the flag to be exact."""
        return int(self.flag("max-num-seqs", 256))


def render_flags(flags: dict[str, FlagValue]) -> list[str]:
    """Engine flags as argv. Booleans are always explicit: `--x` for true, `--no-x` for false, so a
    config that turns a default-on feature off says so and the command line shows it. Mappings
    (e.g. `custom-histogram-buckets`) are passed as JSON, as the engine expects."""
    argv: list[str] = []
    for key, value in flags.items():
        if isinstance(value, bool):
            argv.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, dict):
            argv.extend([f"--{key}", json.dumps(value, separators=(",", ":"))])
        elif isinstance(value, list):
            argv.append(f"--{key}")
            argv.extend(str(v) for v in value)
        else:
            argv.extend([f"--{key}", str(value)])
    return argv


def load_engine_config(path: str | Path) -> EngineConfig:
    """Read and validate one engine config file, raising `EngineConfigError` that names file and key."""
    path = Path(path)
    if not path.is_file():
        raise EngineConfigError(f"{path}: no such engine config file (see engine_configs/)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise EngineConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise EngineConfigError(
            f"{path}: expected a mapping at the top level, got {type(raw).__name__}"
        )
    try:
        return EngineConfig.model_validate(raw)
    except ValidationError as exc:
        raise EngineConfigError(describe_errors(path, exc)) from None


def describe_errors(path: Path, exc: ValidationError) -> str:
    """One line per problem, naming the file and the key."""
    lines = [f"{path}: invalid engine config"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key; remove it or check its spelling")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            lines.append(f"  {key}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)
