"""What the run's driver passes to `ray.init`, and what it stops at its end (no Ray started here;
`tests/integration/test_ray_cluster.py` runs a night on a real two-node cluster)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipelines.job import JobSpec, driver_paths
from pipelines.ray_session import (
    TASK_EVENTS_KEPT,
    RayAddressError,
    RaySession,
    init_kwargs,
    joins_cluster,
    ray_address,
)

REPO = Path(__file__).resolve().parents[2]
NODE_SETTINGS = {
    "num_cpus",
    "num_gpus",
    "resources",
    "labels",
    "object_store_memory",
    "_system_config",
    "include_dashboard",
}
"""What Ray refuses from (or ignores for) a driver that joins a running cluster."""


def test_the_address_comes_from_ray_address_and_empty_means_start_here() -> None:
    assert ray_address({}) is None
    assert ray_address({"RAY_ADDRESS": "  "}) is None
    assert ray_address({"RAY_ADDRESS": "10.0.0.5:6379"}) == "10.0.0.5:6379"


def test_a_joining_driver_passes_no_node_setting() -> None:
    for address in ("10.0.0.5:6379", "auto"):
        assert joins_cluster(address)
        kwargs = init_kwargs(address)
        assert kwargs["address"] == address and not NODE_SETTINGS & set(kwargs)
    for address in (None, "local"):
        assert not joins_cluster(address)
        # Never Ray's default for None: joining whatever `ray start` last ran on this host.
        assert init_kwargs(address)["address"] == "local"
        assert init_kwargs(address)["include_dashboard"] is False
        assert init_kwargs(address)["_system_config"] == {
            "task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT
        }


def test_only_a_session_that_joined_a_cluster_disconnects() -> None:
    assert RaySession("10.0.0.5:6379", connected_here=True).disconnects
    assert not RaySession("10.0.0.5:6379", connected_here=False).disconnects  # the caller's
    assert not RaySession(None, connected_here=True).disconnects  # Ray on this host: the process's
    RaySession(None, connected_here=False).close()  # nothing to stop, and no Ray needed for it


def test_ray_client_addresses_are_refused_with_what_to_use() -> None:
    with pytest.raises(RayAddressError, match="ray job submit"):
        ray_address({"RAY_ADDRESS": "ray://head:10001"})


def test_run_refuses_a_ray_client_address_before_any_work(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"doc_id": "a", "text": "some words"}\n')
    result = CliRunner().invoke(
        app,
        ["run", "--corpus", str(corpus), "--engine-config", str(REPO / "engine_configs" /
         "cpu-tiny.yaml"), "--policy", "static", "--results", str(tmp_path / "results")],
        env={"RAY_ADDRESS": "ray://head:10001"},
    )  # fmt: skip
    assert result.exit_code == 2 and "Ray Client" in result.output
    assert not (tmp_path / "results").exists()


def test_paths_the_driver_and_the_gate_open_are_absolute_and_the_engine_config_is_not() -> None:
    spec = driver_paths(
        JobSpec(
            corpus="c.parquet",
            engine_config="engine_configs/cpu-tiny.yaml",
            replicas=[],
            run_id="r",
            latency_model="fits/x.json",
        )
    )
    assert spec.results == os.path.join(os.getcwd(), "results")
    assert spec.engine_state_dir == os.path.join(os.getcwd(), "results", "engines")
    assert spec.latency_model == os.path.join(os.getcwd(), "fits", "x.json")
    assert spec.engine_config == "engine_configs/cpu-tiny.yaml"  # each node resolves its own
