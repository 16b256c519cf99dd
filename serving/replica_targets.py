"""Which replica a person or a controller means, and the latency fit its plug-in prices with.

A replica is named as `nightshift engine status` lists it, or by URL. One recorded under the state
folder is reached through its control folder; any other URL through its control route.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from scheduler.latency_model import LatencyModel
from serving.engine_config import EngineConfig, EngineConfigError, load_engine_config
from serving.engine_control import ControlTarget
from serving.launcher import Replica, ReplicaSet


class ReplicaLookupError(ValueError):
    """A replica or latency fit that cannot be found; the message says what exists."""


def fit_path(config_path: str | Path, config: EngineConfig) -> Path:
    """Where an engine config's latency fit lives: its `latency_fit`, relative to the config
    file, or by default `fits/<name>.json` beside it. The file may not exist yet."""
    relative = config.latency_fit or f"fits/{config.name}.json"
    return Path(config_path).parent / relative


def configured_fit(config_path: str | Path, config: EngineConfig) -> Path | None:
    """The engine config's latency fit, or None when it names none and the default file is
    absent (a config that was never calibrated). A fit the config names but that is missing is
    an error: steering silently without it would be worse than stopping."""
    path = fit_path(config_path, config)
    if path.is_file():
        return path
    if config.latency_fit is not None:
        raise ReplicaLookupError(
            f"{config_path}: latency_fit {config.latency_fit} does not exist ({path}); measure "
            f"it with `nightshift calibrate --engine-config {config_path} --out {path}`"
        )
    return None


def latency_model_for(config_path: str | Path) -> LatencyModel:
    """The latency fit of the engine config at `config_path`."""
    try:
        config = load_engine_config(config_path)
    except EngineConfigError as exc:
        raise ReplicaLookupError(str(exc)) from None
    path = fit_path(config_path, config)
    if not path.is_file():
        raise ReplicaLookupError(
            f"{config_path}: no latency fit at {path}; measure one with `nightshift calibrate "
            f"--engine-config {config_path} --out {path}` or pass --latency-model"
        )
    return LatencyModel.from_json(path)


def resolve_target(
    replica: str,
    state_dir: str | Path,
    latency_model: str | Path | None = None,
    api_key: str | None = None,
) -> tuple[ControlTarget, LatencyModel]:
    """The control target for `replica` (a recorded name or a URL) and the model to send it."""
    recorded = ReplicaSet(state_dir).load()
    found = _find(recorded, replica)
    if found is None and not replica.startswith(("http://", "https://")):
        names = ", ".join(r.name for r in recorded) or "none recorded"
        raise ReplicaLookupError(f"no replica named {replica!r} under {state_dir} ({names})")
    if latency_model is not None:
        model = LatencyModel.from_json(latency_model)
    elif found is not None:
        model = latency_model_for(found.config)
    else:
        raise ReplicaLookupError(f"{replica} is not recorded here: pass --latency-model")
    if found is not None:
        return ControlTarget(found.name, folder=found.control_dir, base_url=found.base_url), model
    return ControlTarget(replica, base_url=replica, api_key=api_key), model


def control_targets(
    replicas: Iterable[tuple[str, str]],
    state_dir: str | Path,
    api_key: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> dict[str, ControlTarget]:
    """Where each (name, url) replica takes its control document: the control folder of a
    replica recorded under `state_dir`, else its control route. Folders are absolute: the Gate
    that writes them runs in a Ray worker, whose working directory is not the caller's."""
    recorded = ReplicaSet(state_dir).load()
    out = {}
    for name, url in replicas:
        found = _find(recorded, url) or _find(recorded, name)
        if found is not None:
            folder = found.control_dir.absolute()
            out[name] = ControlTarget(name, folder=folder, base_url=found.base_url)
        else:
            out[name] = ControlTarget(name, base_url=url, api_key=api_key, headers=headers)
    return out


def _find(recorded: list[Replica], replica: str) -> Replica | None:
    for r in recorded:
        if replica in (r.name, r.base_url, r.base_url + "/"):
            return r
    return None
