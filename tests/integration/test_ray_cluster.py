"""Nights on a real two-node Ray cluster: separate `ray start` processes, a real replica.

A run joins the cluster through `RAY_ADDRESS`, as a submitted job's entrypoint does: the Gate runs
on the driver's node, the summarizers on both; every document is summarized once; at the end the
run's own actors and driver are gone and the cluster is still up. Then `nightshift run` is started
the way Ray's job supervisor starts a `ray job submit` entrypoint, with the shipped
`deploy/ray/runtime_env.yaml`. (`ray job submit` itself talks to the head's dashboard, which needs
`ray[default]`; the control environment installs `ray[data]`, which has no dashboard.)

Every driver, the runs' and the one that reads the cluster afterwards, is a process of its own
started with the nodes' environment, as on a team's cluster. A driver in the test process would
carry what earlier tests left there: a local `ray.init()` turns token auth on for the whole
process (Ray sets `RAY_AUTH_MODE=token` in its environment and keeps it after shutdown), and the
nodes, started without auth, refuse its calls; the GCS then takes the driver for dead and
destroys the Gate it just created.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml

from bench.processes import session_members
from pipelines.gate import gate_name
from tests.integration.ray_cluster import ray_cluster
from tests.integration.ray_cluster_view import cluster_view
from tests.integration.test_pipeline import write_corpus
from tests.prefect_home import prefect_home
from tests.replicas import TINY
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Where Ray's job supervisor hands a submitted job's runtime_env to its entrypoint."""


def node_env() -> dict:
    """A node's environment as a team's would be: the checkout's code and environment first."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Explicit, or the head turns token auth on by itself wherever ~/.ray/auth_token exists (a
    # local `ray.init` writes one) while a node joining by address does not, and cannot join.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def driver_env(cluster, tmp_path: Path) -> dict:
    """A driver's environment on the cluster: the nodes', joined to the head by `RAY_ADDRESS`."""
    return node_env() | {
        "RAY_ADDRESS": cluster.address,
        # Its temporary server's database, not ~'s.
        "PREFECT_HOME": prefect_home(tmp_path / "prefect"),
    }


def run_command(corpus: Path, engine_config: str, replica_url: str, run_id: str, results: str):
    """`nightshift run` as both nights start it: static caps, so the run asks nothing of the
    controller and its figures depend on the cluster alone."""
    return [
        sys.executable, "-m", "flows.cli", "run", "--corpus", str(corpus),
        "--engine-config", engine_config, "--replica-url", replica_url,
        "--run-id", run_id, "--results", results, "--policy", "static",
        "--static-seats", "2", "--static-chunk", "400",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def node_cwd(tmp_path_factory) -> Path:
    """Where the nodes run: nothing of a run may land here."""
    return tmp_path_factory.mktemp("node-cwd")


@pytest.fixture(scope="module")
def cluster(node_cwd, tmp_path_factory):
    if ray.is_initialized():  # a local Ray an earlier module left up: these runs must join
        ray.shutdown()
    logs = tmp_path_factory.mktemp("ray-logs")  # kept with pytest's last few temp dirs
    with ray_cluster(node_env(), node_cwd, keep_logs=logs) as started:
        yield started
    left = {n.name: session_members(n.process.pid) for n in started.nodes}
    assert not any(left.values()), f"processes of the cluster left running: {left}"


def test_a_night_spreads_over_two_nodes_and_leaves_the_cluster_up(
    cluster, node_cwd: Path, tiny_replica, tmp_path: Path
) -> None:
    driver_cwd = tmp_path / "driver"
    driver_cwd.mkdir()
    doc_ids = write_corpus(tmp_path / "corpus.parquet", docs=8, lo=300, hi=900, seed=11)
    env = driver_env(cluster, tmp_path)
    command = run_command(
        tmp_path / "corpus.parquet", str(TINY), tiny_replica.base_url, "two-nodes", "results"
    )
    # Relative results: resolved in the driver's folder, not on the node the Gate runs on.
    done = subprocess.run(
        command, env=env, cwd=driver_cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]

    run_dir = driver_cwd / "results" / "runs" / "two-nodes"
    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == sorted(doc_ids)  # every document exactly once
    assert set(read_table(run_dir, "documents").column("status").to_pylist()) == {"done"}
    assert not any(node_cwd.iterdir())  # nothing written where the nodes run

    assert all(node.running() for node in cluster.nodes)  # the run stopped no node
    view = cluster_view(cluster.address, "two-nodes", env)
    names = {n.name for n in cluster.nodes}
    assert set(view.alive_nodes.values()) == names
    gate = [a for a in view.placed if a["Name"] == gate_name("two-nodes")]
    assert len(gate) == 1 and view.alive_nodes[gate[0]["node"]] == cluster.head.name
    summarizers = [a for a in view.placed if "Summarize" in a["ActorClassName"]]
    assert {view.alive_nodes[a["node"]] for a in summarizers} == names
    # Every actor of the run is gone. Ray Data's own detached singletons (its stats and
    # autoscaling coordinators) serve every Ray Data job of the cluster: not the run's.
    owned = [a for a in view.placed if not a["IsDetached"]]
    assert gate[0] in owned and all(a in owned for a in summarizers)
    assert [a["ActorClassName"] for a in owned if a["State"] != "DEAD"] == []
    assert view.run_job_dead  # the run disconnected the driver it connected


def test_a_submitted_night_runs_in_the_shipped_runtime_env(
    cluster, tiny_replica, tmp_path: Path
) -> None:
    """The entrypoint as the job supervisor starts it: `RAY_ADDRESS`, the runtime_env's env_vars,
    and the runtime_env itself for `ray.init` to apply; its working_dir is the checkout, as
    `ray job submit` run from the checkout's root uploads it. The engine config is given relative:
    the nodes run in a folder without one, so summarizers find it only in the working_dir."""
    runtime_env = yaml.safe_load((REPO / "deploy" / "ray" / "runtime_env.yaml").read_text())
    runtime_env["working_dir"] = str(REPO / runtime_env["working_dir"])
    env = driver_env(cluster, tmp_path) | runtime_env.get("env_vars", {})
    env[JOB_CONFIG_ENV] = json.dumps({"runtime_env": runtime_env, "metadata": {}})
    doc_ids = write_corpus(tmp_path / "corpus.parquet", docs=4, lo=200, hi=500, seed=12)
    results = tmp_path / "results"
    entrypoint = run_command(
        tmp_path / "corpus.parquet",
        "engine_configs/cpu-tiny.yaml",
        tiny_replica.base_url,
        "submitted",
        str(results),
    )
    done = subprocess.run(
        entrypoint, env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "submitted"
    run_dir = results / "runs" / "submitted"
    assert sorted(read_table(run_dir, "summaries").column("doc_id").to_pylist()) == doc_ids
    assert (results / "nightshift.duckdb").is_file()
    assert (results / "reports" / "submitted" / "report.html").is_file()
    for node in cluster.nodes:  # every node unpacked the submitted checkout and ran in it
        assert list(node.temp_dir.glob("session_*/runtime_resources/working_dir_files/*")), node
        assert node.running()
