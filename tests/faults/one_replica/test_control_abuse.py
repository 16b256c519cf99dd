"""The control channel abused on a real replica with the plug-in (cpu-tiny, `--api-key`): garbage,
a 10 MB document, bad field values, a stale and an expired document and a FIFO in the control
folder; the same kinds and calls without or with a wrong key on the control route. After every
one a chat is served, the plug-in's status counts the rejection with its reason (the route answers
it), and the valid document in force, a pause, stays in force: a batch prompt waiting the whole
time gets no prefill until a valid document over the route lets it go."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import httpx
import pytest

from scheduler.latency_model import LatencyModel
from serving.engine_control import decision_document, next_seq
from serving.engine_site.control_files import CONTROL_FILE, STATUS_FILE
from tests.faults.one_replica.conftest import FIT, KEY

pytestmark = pytest.mark.engine

AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = LatencyModel.from_json(FIT)
TEN_MB = 10 * 1024 * 1024


def valid(seq: int, ttl_s: float = 600, pause: bool = False, target_ms: float = 30.0) -> dict:
    return json.loads(decision_document(seq, target_ms, MODEL, ttl_s, pause).to_json())


def put(replica, content: bytes | str | dict) -> None:
    """Into the control folder as a controller writes it: whole, by rename."""
    if isinstance(content, dict):
        content = json.dumps(content)
    data = content.encode() if isinstance(content, str) else content
    tmp = replica.control_dir / ".abuse.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, replica.control_dir / CONTROL_FILE)


def chat(replica) -> None:
    r = httpx.post(
        f"{replica.base_url}/v1/completions",
        json={"model": replica.served_model, "prompt": "the night shift", "max_tokens": 32,
              "ignore_eos": True},
        headers=AUTH, timeout=30,
    )  # fmt: skip
    assert r.status_code == 200, r.text


def status_after_chat(
    replica, rejected: int, newer_than: float = 0.0, timeout_s: float = 15
) -> dict:
    """Chats (each must be served) until the plug-in's status counts `rejected` rejections and
    was written after `newer_than`; the status is written about once a second while the engine
    steps, never while it idles."""
    deadline = time.monotonic() + timeout_s
    while True:
        chat(replica)
        doc = json.loads((replica.control_dir / STATUS_FILE).read_text())
        fresh = doc["rejected"] >= rejected and doc["written_at"] > newer_than
        if fresh or time.monotonic() > deadline:
            return doc
        time.sleep(0.1)


def file_abuse(held_seq: int) -> list[tuple[str, object, str]]:
    good = valid(next_seq())
    return [
        ("garbage", random.Random(7).randbytes(4096), "not JSON"),
        ("nested", "[" * 10_000, "not JSON: nested too deep"),
        ("10 MB", "{" + " " * (TEN_MB - 1), f"document is {TEN_MB} bytes, more than 16384"),
        (
            "negative target",
            {**good, "batch_step_target_ms": -5.0},
            "batch_step_target_ms must be a finite number >= 0",
        ),
        ("NaN expiry", json.dumps({**good, "expires_at": float("nan")}), "expires_at must be"),
        ("seq as text", {**good, "seq": "one"}, "seq must be int"),
        (
            "negative coefficient",
            {**good, "latency_model": {**good["latency_model"], "s_per_token": -1.0}},
            "latency_model",
        ),
        ("unknown key", {**good, "chunk": 4096}, "unknown key 'chunk'"),
        ("stale seq", valid(held_seq - 1), f"stale seq {held_seq - 1}"),
        ("expired", valid(next_seq(), ttl_s=-30), "expired on arrival"),
        ("fifo", None, "not a regular file"),
    ]


def route_abuse() -> list[tuple[str, dict, dict, int, str]]:
    good = valid(next_seq())
    return [
        ("no key", {}, {"json": good}, 401, "missing or wrong API key"),
        ("wrong key", {"Authorization": "Bearer nope"}, {"json": good}, 401, "wrong API key"),
        ("garbage", AUTH, {"content": random.Random(8).randbytes(4096)}, 422, "not JSON"),
        ("nested", AUTH, {"content": "[" * 10_000}, 422, "nested too deep"),
        ("10 MB", AUTH, {"content": b" " * TEN_MB}, 413, "body over 16384 bytes"),
        (
            "negative target",
            AUTH,
            {"json": {**good, "batch_step_target_ms": -5.0}},
            422,
            "batch_step_target_ms must be a finite number >= 0",
        ),
        ("expired", AUTH, {"json": valid(next_seq(), ttl_s=-30)}, 422, "expired on arrival"),
    ]


def test_every_abuse_is_rejected_with_its_reason_and_the_pause_in_force_holds(replica) -> None:
    url, folder = replica.base_url, replica.control_dir
    held = next_seq()
    in_force = valid(held, pause=True)
    put(replica, in_force)
    paused_at = time.time()
    doc = status_after_chat(replica, 0, newer_than=paused_at)
    assert (doc["state"], doc["control_seq"]) == ("paused", held)
    rejected = doc["rejected"]

    batch: dict = {}

    def batch_prompt() -> None:  # fresh tokens at batch priority: needs a prefill, which is paused
        prompt = [100 + (k * 7919) % 900 for k in range(1500)]  # vocabulary of 1024
        batch["response"] = httpx.post(
            f"{url}/v1/completions",
            json={"model": replica.served_model, "prompt": prompt, "max_tokens": 4,
                  "priority": 10, "ignore_eos": True},
            headers=AUTH, timeout=300,
        )  # fmt: skip
        batch["ended"] = time.time()

    waiting = threading.Thread(target=batch_prompt, daemon=True)
    waiting.start()

    for name, content, reason in file_abuse(held):
        if content is None:  # renamed over the file in one step, as a document is written:
            os.mkfifo(folder / "fifo.tmp")  # an unlink first would let a poll see the file lost
            os.replace(folder / "fifo.tmp", folder / CONTROL_FILE)
        else:
            put(replica, content)
        rejected += 1
        doc = status_after_chat(replica, rejected, newer_than=time.time())
        assert doc["rejected"] == rejected, (name, doc["rejected"], doc["last_rejection"])
        assert reason in doc["last_rejection"], (name, doc["last_rejection"])
        assert (doc["state"], doc["control_seq"]) == ("paused", held), name
    put(replica, in_force)  # the FIFO out; the very document in force again is no news

    for name, headers, body, code, reason in route_abuse():
        r = httpx.post(f"{url}/nightshift/control", headers=headers, timeout=30, **body)
        assert r.status_code == code and reason in r.json()["error"], (name, r.status_code, r.text)
        assert json.loads((folder / CONTROL_FILE).read_text())["seq"] == held, name
        chat(replica)
    for headers in ({}, {"Authorization": "Bearer nope"}):
        assert httpx.get(f"{url}/nightshift/status", headers=headers).status_code == 401

    doc = status_after_chat(replica, rejected, newer_than=time.time())
    assert (doc["state"], doc["control_seq"], doc["rejected"]) == ("paused", held, rejected)
    assert doc["plugin_errors"] == 0  # every abuse was a rejection, none an exception
    assert "response" not in batch, f"the batch prompt ended while paused: {batch}"
    assert doc["last_batch_prefill_at"] is None or doc["last_batch_prefill_at"] < paused_at

    resumed = next_seq()
    r = httpx.post(f"{url}/nightshift/control", json=valid(resumed), headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json() == {"accepted": resumed}
    waiting.join(timeout=120)
    assert batch["response"].status_code == 200, batch["response"].text
    doc = status_after_chat(replica, rejected, newer_than=time.time())
    assert (doc["state"], doc["control_seq"]) == ("active", resumed)
    assert doc["last_batch_prefill_at"] > paused_at

    log = open(replica.log, errors="replace").read()
    for line in ("control document rejected (not JSON", "control document rejected (expired on",
                 "control document over HTTP rejected: not JSON: nested too deep",
                 "control document over HTTP rejected: body over 16384 bytes",
                 "/nightshift/control from 127.0.0.1 refused: missing or wrong API key"):  # fmt: skip
        assert line in log, line
