"""A run's actors on a Ray cluster as its GCS records them, read by a driver of its own.

`python -m tests.integration.ray_cluster_view ADDRESS RUN_ID` prints them as JSON. The reading
driver is a process of its own for the same reason the runs under test are: a driver in the test
process would carry the Ray state earlier tests left there (a local `ray.init()` turns token auth
on for the whole process, and nodes started without auth refuse its calls). Ray's state API,
`ray.util.state`, is served by the dashboard, which `ray[data]` lacks, so this reads the GCS
tables through `ray._private.state`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from pipelines.gate import gate_name


@dataclass(frozen=True)
class ClusterView:
    placed: list[dict]
    """The run's actors as the GCS lists them, each with the id of the node it ran on (`node`)."""
    alive_nodes: dict[str, str]
    """Live node ids to their names (the node's custom resource, `ns_...`)."""
    run_job_dead: bool
    """Whether the run's job (its driver) has ended."""


def read(address: str, run_id: str) -> dict:
    import ray
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
        return {"placed": placed, "alive_nodes": nodes, "run_job_dead": jobs[run_job_id]["IsDead"]}
    finally:
        ray.shutdown()


def cluster_view(address: str, run_id: str, env: dict, timeout_s: float = 120) -> ClusterView:
    """Run `read` in a new Python process with `env` (the nodes' environment)."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, address, run_id],
        env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"reading the cluster failed:\n{done.stderr[-3000:]}")
    return ClusterView(**json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1], sys.argv[2]), default=str))
