"""`nightshift engine up|status|down` as a user runs them, against real replicas."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from bench.processes import group_members
from tests.replicas import TINY, free_port_block

NIGHTSHIFT = [sys.executable, "-m", "flows.cli"]


def run(*args: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NIGHTSHIFT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.engine
def test_two_replicas_up_status_down_leaves_nothing(tmp_path: Path) -> None:
    state = str(tmp_path / "engines")
    port = free_port_block(2)
    up = run(
        "engine", "up", str(TINY), "--port", str(port), "--replicas", "2", "--state-dir", state
    )
    assert up.returncode == 0, up.stderr
    replicas = yaml.safe_load(Path(state, "replicas.json").read_text())
    assert [r["port"] for r in replicas] == [port, port + 1]
    for r in replicas:
        resp = httpx.post(
            f"http://127.0.0.1:{r['port']}/v1/completions",
            timeout=60,
            json={"model": "nightshift-tiny", "prompt": "hi", "max_tokens": 3},
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
        assert len(group_members(r["pid"])) >= 2  # API server plus engine core at least
    status = run("engine", "status", "--state-dir", state)
    assert status.stdout.count("healthy") == 2
    down = run("engine", "down", "--state-dir", state)
    assert down.returncode == 0 and "stopped 2" in down.stdout
    time.sleep(0.5)
    assert all(group_members(r["pid"]) == set() for r in replicas)
    assert "no replicas recorded" in run("engine", "status", "--state-dir", state).stdout


@pytest.mark.engine
def test_engine_dying_on_start_fails_fast_with_log_tail(tmp_path: Path) -> None:
    doc = yaml.safe_load(TINY.read_text())
    # Passes vLLM's argument parser (checked before start), fails once the engine reads the model.
    doc["vllm"]["max-model-len"] = 65536
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    t0 = time.monotonic()
    up = run(
        "engine",
        "up",
        str(bad),
        "--port",
        str(free_port_block(1)),
        "--state-dir",
        str(tmp_path / "engines"),
        "--timeout",
        "300",
    )
    assert up.returncode == 2
    assert "exited during start-up" in up.stderr and "max_model_len" in up.stderr
    assert time.monotonic() - t0 < 120
    assert (
        "no replicas recorded"
        in run("engine", "status", "--state-dir", str(tmp_path / "engines")).stdout
    )


def test_the_config_is_given_once_by_option_or_position() -> None:
    old = run("engine", "up", str(TINY), "--dry-run", "--port", "8123")
    assert old.returncode == 0, old.stderr
    assert "--port 8123" in old.stdout
    none = run("engine", "up", "--dry-run")
    assert none.returncode == 2 and "--engine-config" in none.stderr
    other = TINY.with_name("cpu-small.yaml")
    both = run("engine", "up", str(TINY), "--engine-config", str(other), "--dry-run")
    assert both.returncode == 2 and "keep one" in both.stderr


def test_invalid_config_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(TINY.read_text() + "replicaz: 3\n")
    up = run("engine", "up", str(bad), "--dry-run")
    assert up.returncode == 2
    assert "typo.yaml" in up.stderr and "replicaz" in up.stderr


def test_busy_port_is_refused_before_starting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        up = run("engine", "up", str(TINY), "--port", str(port), "--state-dir", str(tmp_path))
    assert up.returncode == 2 and f"port {port}" in up.stderr and "in use" in up.stderr


def test_missing_model_names_the_build_command(tmp_path: Path) -> None:
    up = run("engine", "up", str(TINY), "--dry-run", env={"NIGHTSHIFT_CACHE": str(tmp_path)})
    assert up.returncode == 2
    assert "not built" in up.stderr and "nightshift model build tiny" in up.stderr


def test_dry_run_prints_the_exact_command() -> None:
    up = run("engine", "up", "--engine-config", str(TINY), "--dry-run", "--port", "8123")
    assert up.returncode == 0, up.stderr
    line = up.stdout.strip()
    assert "-m vllm.entrypoints.openai.api_server" in line and "--port 8123" in line
    assert "--enable-chunked-prefill" in line and "--scheduling-policy priority" in line
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=1")
