"""Nights on a real two-node Ray cluster: separate `ray start` processes, a real replica.

A run joins the cluster through `RAY_ADDRESS`, as a submitted job's entrypoint does: the Gate runs
on the driver's node, the summarizers on both; every document is summarized once; at the end the
run's own actors and driver are gone and the cluster is still up. Then `nightshift run` is started
the way Ray's job supervisor starts a `ray job submit` entrypoint, with the shipped
`deploy/ray/runtime_env.yaml`. (`ray job submit` itself talks to the head's dashboard, which needs
`ray[default]`; the control environment installs `ray[data]`, which has no dashboard.)
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
from pipelines.job import run_job
from tests.integration.ray_cluster import ray_cluster
from tests.integration.test_pipeline import spec_for, write_corpus
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


@pytest.mark.xfail(
    strict=False,
    reason="open: after another module's local ray.init() the driver runs with token auth "
    "(Ray sets RAY_AUTH_MODE=token in os.environ and keeps it) while the nodes run without: it "
    "refuses their calls ('Missing authorization header') and the GCS destroys the Gate at its "
    "creation. Setting the mode back in the fixture was not enough; passes alone",
)
def test_a_night_spreads_over_two_nodes_and_leaves_the_cluster_up(
    cluster, node_cwd: Path, tiny_replica, tmp_path: Path, monkeypatch
) -> None:
    driver_cwd = tmp_path / "driver"
    driver_cwd.mkdir()
    doc_ids = write_corpus(tmp_path / "corpus.parquet", docs=8, lo=300, hi=900, seed=11)
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.chdir(driver_cwd)  # relative results: resolved on the driver, not the Gate
    spec = spec_for(tmp_path / "corpus.parquet", [tiny_replica], Path("results"), "two-nodes")
    result = run_job(spec)

    assert not ray.is_initialized()  # the run disconnected the driver it connected
    run_dir = driver_cwd / "results" / "runs" / "two-nodes"
    assert result.run_dir == run_dir and result.docs_done == len(doc_ids)
    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == sorted(doc_ids)  # every document exactly once
    assert set(read_table(run_dir, "documents").column("status").to_pylist()) == {"done"}
    assert not any(node_cwd.iterdir())  # nothing written where the nodes run

    assert all(node.running() for node in cluster.nodes)  # the run stopped no node
    placed, alive_nodes, run_job_dead = _cluster_view(cluster.address, "two-nodes")
    names = {n.name for n in cluster.nodes}
    assert set(alive_nodes.values()) == names
    gate = [a for a in placed if a["Name"] == gate_name("two-nodes")]
    assert len(gate) == 1 and alive_nodes[gate[0]["node"]] == cluster.head.name
    summarizers = [a for a in placed if "Summarize" in a["ActorClassName"]]
    assert {alive_nodes[a["node"]] for a in summarizers} == names
    # Every actor of the run is gone. Ray Data's own detached singletons (its stats and
    # autoscaling coordinators) serve every Ray Data job of the cluster: not the run's.
    owned = [a for a in placed if not a["IsDetached"]]
    assert gate[0] in owned and all(a in owned for a in summarizers)
    assert [a["ActorClassName"] for a in owned if a["State"] != "DEAD"] == []
    assert run_job_dead


def test_a_submitted_night_runs_in_the_shipped_runtime_env(
    cluster, tiny_replica, tmp_path: Path
) -> None:
    """The entrypoint as the job supervisor starts it: `RAY_ADDRESS`, the runtime_env's env_vars,
    and the runtime_env itself for `ray.init` to apply; its working_dir is the checkout, as
    `ray job submit` run from the checkout's root uploads it. The engine config is given relative:
    the nodes run in a folder without one, so summarizers find it only in the working_dir."""
    runtime_env = yaml.safe_load((REPO / "deploy" / "ray" / "runtime_env.yaml").read_text())
    runtime_env["working_dir"] = str(REPO / runtime_env["working_dir"])
    env = node_env() | runtime_env.get("env_vars", {})
    env |= {
        "RAY_ADDRESS": cluster.address,
        JOB_CONFIG_ENV: json.dumps({"runtime_env": runtime_env, "metadata": {}}),
        "PREFECT_HOME": str(tmp_path / "prefect"),  # its temporary server's database, not ~'s
    }
    doc_ids = write_corpus(tmp_path / "corpus.parquet", docs=4, lo=200, hi=500, seed=12)
    results = tmp_path / "results"
    entrypoint = [
        sys.executable, "-m", "flows.cli", "run", "--corpus", str(tmp_path / "corpus.parquet"),
        "--engine-config", "engine_configs/cpu-tiny.yaml", "--replica-url", tiny_replica.base_url,
        "--run-id", "submitted", "--results", str(results), "--policy", "static",
        "--static-seats", "2", "--static-chunk", "400",
    ]  # fmt: skip
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


def _cluster_view(address: str, run_id: str):
    """The run's actors (with the node each ran on), the cluster's live nodes by id and their
    names, and whether the run's job has ended, read from the cluster's GCS by a new driver.
    (Ray's state API, `ray.util.state`, is served by the dashboard, which `ray[data]` lacks.)"""
    from ray._private import state

    ray.init(address=address, log_to_driver=False)
    try:
        me = ray.get_runtime_context().get_job_id()
        nodes = {
            n["NodeID"]: next(r for r in n["Resources"] if r.startswith("ns_"))
            for n in ray.nodes()
            if n["Alive"]
        }
        actors = list(state.actors().values())
        run_job_id = next(a["JobID"] for a in actors if a["Name"] == gate_name(run_id))
        placed = [a | {"node": a["Address"]["NodeID"]} for a in actors if a["JobID"] == run_job_id]
        jobs = {j["JobID"]: j for j in state.jobs() if j["JobID"] != me}
        return placed, nodes, jobs[run_job_id]["IsDead"]
    finally:
        ray.shutdown()
