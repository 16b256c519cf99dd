"""A real Prometheus for the tests that read replicas through one (its rate() extrapolation and
histogram_quantile are what production sees): `bench.prometheus_server`'s server, on loopback,
tied to the test process and stopped when the `with` block exits."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench.prometheus_server import INSTALL_HINT, PrometheusServer, PrometheusStartError

__all__ = ["INSTALL_HINT", "PrometheusStartError", "prometheus_binary", "prometheus_server"]


def prometheus_binary() -> str | None:
    """Path of the `prometheus` executable, or None when it is not installed."""
    return shutil.which("prometheus")


@contextlib.contextmanager
def prometheus_server(
    workdir: Path,
    jobs: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    ready_timeout_s: float = 30.0,
) -> Iterator[str]:
    """Run Prometheus scraping `jobs` (and evaluating `rule_files`) with its data under
    `workdir`; yields its base URL."""
    server = PrometheusServer(workdir, jobs, rule_files)
    try:
        yield server.start(ready_timeout_s)
    finally:
        server.stop()
