"""The shipped `prefect.yaml` deployed to a real `prefect server start` on loopback, and a process
worker running a scheduled night from it on a real replica that wants an API key.

One night, end to end as production runs it: `prefect deploy` with the file's pull step, a flow
run scheduled for a past night, picked up by `prefect worker start`, reading its replicas from a
file and the key from the worker's environment. It checks what only this path shows: the run id
comes from the scheduled date, the key reaches every request (checks, summaries, the control
route) and is written nowhere (run files, the Prefect server's database, the worker's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from tests.prefect_home import prefect_home
from tests.replicas import REPO, TINY, free_port_block

pytestmark = pytest.mark.engine

KEY = "deploy-test-key-5c1e"
NIGHT = datetime(2024, 1, 15, 1, 0, tzinfo=UTC)
FIT = REPO / "engine_configs" / "fits" / "cpu-small.json"
TIMEOUT_S = 240.0


def test_a_worker_runs_the_scheduled_night_from_the_shipped_deployment(tmp_path: Path) -> None:
    env = prefect_env(tmp_path)
    with background(
        [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", env["PORT"], "--no-ui",
         "--analytics-off", "--no-services"],
        env, tmp_path / "server.log",
    ), keyed_replica(tmp_path) as replica:  # fmt: skip
        wait_healthy(env["PREFECT_API_URL"], tmp_path / "server.log")
        prefect(env, "work-pool", "create", "nightly-test", "--type", "process")
        params = night_parameters(tmp_path, replica.base_url)
        prefect(
            env, "--no-prompt", "deploy", "--prefect-file", str(REPO / "prefect.yaml"),
            "-n", "nightly", "--pool", "nightly-test", "--params", json.dumps(params),
        )  # fmt: skip
        worker_env = env | {"NIGHTSHIFT_REPLICA_API_KEY": KEY}
        worker_log = tmp_path / "worker.log"
        with background(
            [*PREFECT, "worker", "start", "--pool", "nightly-test", "--type", "process"],
            worker_env, worker_log,
        ):  # fmt: skip
            night = run_night(env)
        control = (replica.control_dir / "control.json").is_file()
    assert night["state"] == "COMPLETED", night

    results = Path(params["results"])
    con = duckdb.connect(str(results / "nightshift.duckdb"), read_only=True)
    docs = dict(con.execute("select status, count(*) from documents group by 1").fetchall())
    run_ids = {r[0] for r in con.execute("select distinct run_id from documents").fetchall()}
    assert run_ids == {"nightly-2024-01-15"}  # the scheduled night's date: a retry resumes it
    assert docs == {"done": 2}  # summarized with the key, which /v1 demands
    assert control  # the Gate's control document reached the route, which demands the key too
    assert "run nightly-2024-01-15 success: 2 done" in night["log"], night["log"]
    for where in (results, Path(env["PREFECT_HOME"]), worker_log):
        assert not holds(where, KEY.encode()), f"the replicas' key was written under {where}"


# -- the night ------------------------------------------------------------------------------


def night_parameters(tmp_path: Path, replica_url: str) -> dict:
    """The shipped deployment's parameters, pointed at this test's corpus, replica and results."""
    words = "the river market ledger contract tenant clause notice rent repair".split()
    rows = [
        {"doc_id": f"d{i}", "text": " ".join(words[(i + j) % len(words)] for j in range(200))}
        for i in range(2)
    ]
    corpus = tmp_path / "tonight.parquet"
    pq.write_table(pa.Table.from_pylist(rows), corpus)
    replicas = tmp_path / "replicas.txt"
    replicas.write_text(f"# tonight's replicas\n{replica_url}\n")
    shipped = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"][0]["parameters"]
    return shipped | {
        "corpus": str(corpus),
        "engine_config": str(tmp_path / "cpu-tiny-keyed.yaml"),
        "replica_file": str(replicas),
        "results": str(tmp_path / "results"),
        "policy": "budget",
        "latency_model": str(FIT),
        "deadline": None,
        "metrics_port": None,
        "show_progress": False,
        "pipeline": {
            "max_model_len": 4096,
            "section_summary_tokens": 8,
            "final_summary_tokens": 8,
            "ignore_eos": True,
        },
    }


def run_night(env: dict[str, str]) -> dict:
    """A flow run of the deployment scheduled for NIGHT, waited for until it ends."""
    code = f"""
import asyncio, json, sys
from datetime import datetime
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.states import Scheduled

async def main():
    async with get_client() as client:
        deployment = await client.read_deployment_by_name("nightly_summarization/nightly")
        run = await client.create_flow_run_from_deployment(
            deployment.id, state=Scheduled(scheduled_time=datetime.fromisoformat("{NIGHT.isoformat()}"))
        )
        for _ in range({int(TIMEOUT_S)}):
            run = await client.read_flow_run(run.id)
            if run.state and run.state.is_final():
                break
            await asyncio.sleep(1)
        only = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))
        text = ""
        for _ in range(20):  # the run's last lines reach the server just after its end
            text = "\\n".join(l.message for l in await client.read_logs(log_filter=only))
            if " already done, " in text:
                break
            await asyncio.sleep(0.5)
        print(json.dumps({{"state": run.state.type.value if run.state else None, "log": text}}))

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def keyed_replica(tmp_path: Path):
    """A cpu-tiny replica that answers /v1 only with KEY, stopped on any exit."""
    doc = yaml.safe_load(TINY.read_text())
    doc["env"]["VLLM_API_KEY"] = KEY
    path = tmp_path / "cpu-tiny-keyed.yaml"
    path.write_text(yaml.safe_dump(doc))
    with ReplicaSet(tmp_path / "engines").running(
        load_engine_config(path), str(path), free_port_block(1)
    ) as started:
        yield started[0]


# -- Prefect processes ------------------------------------------------------------------------

PREFECT = [sys.executable, "-m", "prefect"]


def prefect_env(tmp_path: Path) -> dict[str, str]:
    port = str(free_port_block(1))
    return {
        **os.environ,
        "PORT": port,
        "PREFECT_HOME": prefect_home(tmp_path / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "NIGHTSHIFT_HOME": str(REPO),
    }


def prefect(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@contextlib.contextmanager
def background(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A process in its own group, its output in `log`; the whole group is stopped on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(api_url: str, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api_url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"Prefect server not healthy in {timeout_s:.0f} s:\n{log.read_text()}")


def holds(where: Path, needle: bytes) -> bool:
    files = [where] if where.is_file() else [p for p in where.rglob("*") if p.is_file()]
    return any(needle in p.read_bytes() for p in files)
