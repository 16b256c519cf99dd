"""The control route on a real replica's own port, behind the replica's API key: what a
controller on another host uses instead of the control folder."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import yaml

from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from tests.integration.conftest import REPO, TINY, free_port_block

KEY = "route-test-key-7f3a"
FIT = REPO / "engine_configs" / "fits" / "cpu-small.json"


@pytest.fixture(scope="module")
def keyed_replica(tmp_path_factory):
    doc = yaml.safe_load(TINY.read_text())
    doc["env"]["VLLM_API_KEY"] = KEY
    path = tmp_path_factory.mktemp("cfg") / "cpu-tiny-keyed.yaml"
    path.write_text(yaml.safe_dump(doc))
    replicas = ReplicaSet(tmp_path_factory.mktemp("engines"))
    with replicas.running(load_engine_config(path), str(path), free_port_block(1)) as started:
        yield started[0]


def control_doc(seq: int, **over) -> dict:
    coefficients = json.loads(FIT.read_text())["coefficients"]
    return {"seq": seq, "expires_at": 4e9, "batch_step_target_ms": 30.0,
            "latency_model": coefficients, **over}  # fmt: skip


def test_the_route_takes_documents_only_with_the_key_and_names_bad_fields(keyed_replica):
    url = keyed_replica.base_url
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{url}/nightshift/control", json=control_doc(1)).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (
        httpx.post(f"{url}/nightshift/control", json=control_doc(1), headers=wrong).status_code
        == 401
    )
    bad = httpx.post(
        f"{url}/nightshift/control", json={**control_doc(1), "seq": "one"}, headers=auth
    )
    assert bad.status_code == 422 and "seq must be int" in bad.json()["error"]
    ok = httpx.post(f"{url}/nightshift/control", json=control_doc(2), headers=auth)
    assert ok.status_code == 200
    written = json.loads((keyed_replica.control_dir / "control.json").read_text())
    assert written["seq"] == 2 and written["batch_step_target_ms"] == 30.0

    chat = httpx.post(
        f"{url}/v1/completions",
        json={"model": keyed_replica.served_model, "prompt": "hello", "max_tokens": 8},
        headers=auth,
        timeout=60,
    )
    assert chat.status_code == 200, "chat is served under the plug-in"
    assert httpx.get(f"{url}/nightshift/status").status_code == 401
    status = httpx.get(f"{url}/nightshift/status", headers=auth)
    assert status.status_code == 200 and status.json()["state"] == "active"


def test_engine_budget_reaches_a_remote_replica_by_url_with_the_key(keyed_replica):
    cli = [sys.executable, "-m", "flows.cli", "engine", "budget", keyed_replica.base_url]
    without = subprocess.run([*cli, "--pause", "--latency-model", str(FIT)],
                             capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert without.returncode == 2 and "401" in without.stderr
    sent = subprocess.run(
        [*cli, "--target-ms", "12.5", "--latency-model", str(FIT), "--api-key", KEY],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert "batch step target 12.5 ms" in sent.stdout
    assert KEY not in sent.stdout + sent.stderr
    written = json.loads((keyed_replica.control_dir / "control.json").read_text())
    assert written["batch_step_target_ms"] == 12.5
    assert KEY not in open(keyed_replica.log).read(), "the key never reaches the replica's log"
