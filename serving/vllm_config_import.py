"""A team's `vllm serve --config` YAML turned into an engine config, so their replicas keep the
flags they already tuned.

Pure: a parsed YAML mapping in, the engine config mapping and a list of notes out. The notes say
what was not copied and why (the launcher's own flags, the API key), so nothing is dropped
silently. vLLM reads keys in either spelling (`max-num-seqs`, `max_num_seqs`, with or without
leading dashes); the engine config writes them in dash form, as its schema requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PLUGIN_SCHEDULERS = {
    "gpu": "serving.engine_site.budget_scheduler.AsyncBudgetScheduler",
    "cpu": "serving.engine_site.budget_scheduler.BudgetScheduler",
}
"""GPU hosts schedule asynchronously in vLLM, hence the async variant of the plug-in there."""
LAUNCHER_OWNED = ("host", "port")
SECRET_KEYS = ("api-key",)


class ImportConfigError(ValueError):
    """A vLLM config file that cannot become an engine config; the message says what to change."""


@dataclass
class Imported:
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def dash_key(key: str) -> str:
    return str(key).lstrip("-").replace("_", "-")


def import_vllm_config(
    raw: object,
    name: str,
    kind: str = "gpu",
    gpu_type: str | None = None,
    hourly_usd: float = 0.0,
    plugin: bool = True,
) -> Imported:
    """The engine config for the flags in `raw` (a parsed `vllm serve --config` file).

    With `plugin`, the config selects the engine plug-in and the priority scheduling batch relies
    on (batch yields to chat by priority), unless the file already picks a scheduler class."""
    if not isinstance(raw, dict):
        raise ImportConfigError(
            f"expected a mapping of vLLM flags at the top level, got {type(raw).__name__}"
        )
    if kind not in PLUGIN_SCHEDULERS:
        raise ImportConfigError(f"hardware kind {kind!r}: use gpu or cpu")
    flags = {dash_key(k): v for k, v in raw.items()}
    notes: list[str] = []
    model = flags.pop("model", None)
    if not model:
        raise ImportConfigError(
            "no `model` key: `vllm serve` takes the model as its argument, so add "
            "`model: <path or hub id>` to the file"
        )
    served = flags.pop("served-model-name", None)
    if isinstance(served, list):
        if len(served) > 1:
            notes.append(f"served-model-name: kept {served[0]!r}, the first of {served}")
        served = served[0] if served else None
    for key in LAUNCHER_OWNED:
        if key in flags:
            notes.append(f"{key}: not copied; `nightshift engine up --{key}` sets it")
            flags.pop(key)
    for key in SECRET_KEYS:
        if key in flags:
            flags.pop(key)
            notes.append(
                f"{key}: not copied, a key does not belong in a config file; give the replica "
                "VLLM_API_KEY in its environment and the run NIGHTSHIFT_REPLICA_API_KEY"
            )
    count = 1
    for key in ("tensor-parallel-size", "pipeline-parallel-size"):
        value = flags.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ImportConfigError(f"{key}: expected a positive integer, got {value!r}")
        count *= value
    if plugin:
        if "scheduler-cls" in flags:
            notes.append(
                f"scheduler-cls: kept {flags['scheduler-cls']!r}; the engine plug-in is "
                f"{PLUGIN_SCHEDULERS[kind]}, and without it batch is not steered"
            )
        else:
            flags["scheduler-cls"] = PLUGIN_SCHEDULERS[kind]
        if flags.get("scheduling-policy", "priority") != "priority":
            notes.append(
                f"scheduling-policy: kept {flags['scheduling-policy']!r}; batch yields to chat "
                "only under `priority`"
            )
        flags.setdefault("scheduling-policy", "priority")
    hardware: dict[str, Any] = {"kind": kind, "count": count, "hourly_usd": hourly_usd}
    if gpu_type:
        hardware["gpu_type"] = gpu_type
    return Imported(
        config={
            "name": name,
            "model": {"path": str(model), "served_name": str(served or model)},
            "hardware": hardware,
            "vllm": flags,
        },
        notes=notes,
    )
