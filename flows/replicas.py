"""Replicas a run talks to: given URLs checked up front, or replicas started for the run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx

from serving.engine_config import EngineConfig
from serving.launcher import ReplicaSet, free_port


class ReplicaUnreachable(RuntimeError):
    """A replica URL that does not answer or serves another model; checked before any work."""


def check_replica(url: str, served_model: str, timeout_s: float = 5.0) -> str:
    """The replica's name (host:port) once /health answers and /v1/models lists `served_model`."""
    base = url.rstrip("/")
    try:
        httpx.get(f"{base}/health", timeout=timeout_s).raise_for_status()
        models = httpx.get(f"{base}/v1/models", timeout=timeout_s).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ReplicaUnreachable(
            f"replica {url} is not reachable ({type(exc).__name__}: {exc}); start it with "
            "`nightshift engine up --engine-config CONFIG` or leave out --replica-url to let the "
            "run start one"
        ) from None
    served = [m.get("id") for m in models.get("data", [])]
    if served_model not in served:
        raise ReplicaUnreachable(
            f"replica {url} serves {served}, not {served_model!r}: is it the engine config's "
            "model? pass the matching --engine-config"
        )
    parsed = urlparse(base)
    return f"{parsed.hostname}:{parsed.port}"


@contextlib.contextmanager
def replicas_for_run(
    config: EngineConfig,
    config_path: str,
    urls: list[str],
    count: int = 1,
    port: int | None = None,
    state_dir: str = "results/engines",
) -> Iterator[list[tuple[str, str]]]:
    """(name, url) pairs: the given URLs after checking them, or `count` replicas started from
    the config for the duration of the block and stopped on any exit."""
    if urls:
        yield [(check_replica(u, config.model.served_name), u.rstrip("/")) for u in urls]
        return
    with ReplicaSet(state_dir).running(
        config, config_path, port or free_port(count=count), count
    ) as started:
        yield [(r.name, r.base_url) for r in started]
