"""Replicas a run talks to: given URLs checked up front, or replicas started for the run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx

from serving.engine_config import EngineConfig
from serving.launcher import ReplicaSet, free_port
from serving.replica_auth import ReplicaAuth


class ReplicaUnreachable(RuntimeError):
    """A replica URL that does not answer or serves another model; checked before any work."""


def check_replica(
    url: str, served_model: str, timeout_s: float = 5.0, auth: ReplicaAuth | None = None
) -> str:
    """The replica's name (host:port) once /health answers and /v1/models lists `served_model`."""
    base = url.rstrip("/")
    headers = (auth or ReplicaAuth()).http_headers()
    try:
        httpx.get(f"{base}/health", headers=headers, timeout=timeout_s).raise_for_status()
        answer = httpx.get(f"{base}/v1/models", headers=headers, timeout=timeout_s)
        if answer.status_code == 401:
            raise ReplicaUnreachable(
                f"replica {url} refused the API key ({'a wrong one' if auth and auth.api_key else 'none given'}): "
                "set NIGHTSHIFT_REPLICA_API_KEY (or --api-key) to the replicas' key"
            )
        models = answer.json()
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
    auth: ReplicaAuth | None = None,
) -> Iterator[list[tuple[str, str]]]:
    """(name, url) pairs: the given URLs after checking them, or `count` replicas started from
    the config for the duration of the block and stopped on any exit."""
    if urls:
        served = config.model.served_name
        yield [(check_replica(u, served, auth=auth), u.rstrip("/")) for u in urls]
        return
    with ReplicaSet(state_dir).running(
        config, config_path, port or free_port(count=count), count
    ) as started:
        yield [(r.name, r.base_url) for r in started]


def parse_replica_list(text: str, source: str) -> list[str]:
    """Replica base URLs, one per line; blank lines and `#` comments are skipped."""
    urls = []
    for number, line in enumerate(text.splitlines(), 1):
        url = line.split("#", 1)[0].strip()
        if not url:
            continue
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or not parsed.port:
            raise ReplicaUnreachable(
                f"{source}:{number}: {url!r} is not a replica URL; write one "
                "http://host:port per line"
            )
        urls.append(url.rstrip("/"))
    return urls


def read_replica_file(path: str | Path) -> list[str]:
    """The replica URLs listed in the file at `path` (see `parse_replica_list`)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReplicaUnreachable(f"replica file {path}: {exc.strerror or exc}") from None
    urls = parse_replica_list(text, str(path))
    if not urls:
        raise ReplicaUnreachable(f"replica file {path} lists no replica URL")
    return urls
