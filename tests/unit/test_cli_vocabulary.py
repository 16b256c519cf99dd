"""One vocabulary across the command line: names, defaults and spellings every command shares."""

from __future__ import annotations

import click
from typer.main import get_command
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


def commands(group: click.Group, path: tuple[str, ...] = ()):
    """Every leaf command of the CLI, with the words that call it."""
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_json_is_a_path_everywhere():
    with_json = {}
    for path, cmd in commands(get_command(app)):
        for param in cmd.params:
            if "--json" in param.opts:
                with_json[" ".join(path)] = param
    assert {"plan", "simulate", "bench", "chat-load"} <= set(with_json)
    for name, param in with_json.items():
        assert not param.is_flag and "- for stdout" in param.help, name


def test_an_engine_config_is_always_given_as_engine_config():
    spellings = {
        opt
        for _, cmd in commands(get_command(app))
        for param in cmd.params
        for opt in param.opts
        if opt.startswith("--") and "config" in opt
    }
    assert spellings == {"--engine-config", "--emit-engine-config"}


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
