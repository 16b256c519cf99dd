"""The control route on a real replica's own port, behind the replica's API key (the folder's
keyed cpu-tiny replica): what a controller on another host uses instead of the control folder.
Documents carry fresh sequence numbers (`next_seq`), since earlier cases leave theirs in force."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from serving.engine_control import next_seq
from tests.faults.one_replica.conftest import FIT, KEY
from tests.replicas import REPO


def control_doc(seq: int, **over) -> dict:
    coefficients = json.loads(FIT.read_text())["coefficients"]
    return {"seq": seq, "expires_at": 4e9, "batch_step_target_ms": 30.0,
            "latency_model": coefficients, **over}  # fmt: skip


def test_the_route_takes_documents_only_with_the_key_and_names_bad_fields(replica):
    url = replica.base_url
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{url}/nightshift/control", json=control_doc(next_seq())).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (
        httpx.post(
            f"{url}/nightshift/control", json=control_doc(next_seq()), headers=wrong
        ).status_code
        == 401
    )
    bad = httpx.post(
        f"{url}/nightshift/control", json={**control_doc(next_seq()), "seq": "one"}, headers=auth
    )
    assert bad.status_code == 422 and "seq must be int" in bad.json()["error"]
    seq = next_seq()
    ok = httpx.post(f"{url}/nightshift/control", json=control_doc(seq), headers=auth)
    assert ok.status_code == 200
    written = json.loads((replica.control_dir / "control.json").read_text())
    assert written["seq"] == seq and written["batch_step_target_ms"] == 30.0

    chat = httpx.post(
        f"{url}/v1/completions",
        json={"model": replica.served_model, "prompt": "hello", "max_tokens": 8},
        headers=auth,
        timeout=60,
    )
    assert chat.status_code == 200, "chat is served under the plug-in"
    assert httpx.get(f"{url}/nightshift/status").status_code == 401
    status = httpx.get(f"{url}/nightshift/status", headers=auth)
    assert status.status_code == 200 and status.json()["state"] == "active"


def test_engine_budget_reaches_a_remote_replica_by_url_with_the_key(replica):
    cli = [sys.executable, "-m", "flows.cli", "engine", "budget", replica.base_url]
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
    written = json.loads((replica.control_dir / "control.json").read_text())
    assert written["batch_step_target_ms"] == 12.5
    assert KEY not in open(replica.log).read(), "the key never reaches the replica's log"
