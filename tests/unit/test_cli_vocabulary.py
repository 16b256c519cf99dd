"""One vocabulary across the command line: names, defaults and spellings every command shares."""

from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app
from scheduler.policy_factory import POLICIES, PolicyChoice, PolicyError, make_policy
from scheduler.slo import SLO
from scheduler.specs import gpu_spec
from serving.launcher import free_port, port_in_use
from serving.paths import DEFAULT_PORT


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("nightshift ")


def test_every_command_that_chooses_a_policy_says_policy():
    for command in ("run", "simulate", "schedule"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--policy" in result.stdout, command


def test_json_is_a_path_everywhere():
    for command in ("plan", "simulate", "bench", "chat-load"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--json" in result.stdout and "for stdout" in result.stdout, command


def test_the_policy_names_are_one_set():
    assert POLICIES == ("none", "static", "budget", "slo")
    try:
        PolicyChoice("fast")  # type: ignore[arg-type]
    except PolicyError as exc:
        assert "none, static, budget, slo" in str(exc)
    else:
        raise AssertionError("an unknown policy was accepted")
    assert make_policy(PolicyChoice("budget", 3, target_ms=25.0), SLO()).decide is not None


def test_gpu_aliases():
    assert gpu_spec("h100") == gpu_spec("h100-sxm")
    assert gpu_spec("H100-SXM").name == "h100-sxm"


def test_replicas_start_on_the_first_free_ports_from_the_default():
    port = free_port(count=2)
    assert port >= DEFAULT_PORT
    assert not port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", port + 1)
