"""`nightshift chat-load`: bad input fails fast with exit status 2, before any replica starts."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from flows.cli_chat_load import format_summary, register
from tests.conftest import REPO

app = typer.Typer()
app.callback()(lambda: None)  # keep `chat-load` a subcommand, as in the real CLI
register(app)
runner = CliRunner()
TINY = ["chat-load", "--engine-config", str(REPO / "engine_configs" / "cpu-tiny.yaml")]
URL = ["--replica-url", "http://127.0.0.1:9"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([*URL], "give --rate (requests/s) or --trace CSV"),
        (["--rate", "1", "--replica-url", "localhost:8000"], "is not a base URL"),
        (["--rate", "1", "--scale", "1", *URL], "max-model-len is 4096; lower --scale"),
        (["--rate", "1", "--routing", "random", *URL], "routing 'random'"),
        (["--rate", "1", "--trace-speedup", "2", *URL], "--trace-speedup needs --trace"),
        (["--rate", "1", "--run-id", "bad id", *URL], "not usable as a directory name"),
        (["--rate", "0", *URL], "rate must be positive"),
        (["--rate", "1", "--turns", "0", *URL], "turns must be >= 1"),
        (["--rate", "1", *URL], "no healthy replica answers http://127.0.0.1:9/health"),
    ],
)
def test_bad_input_names_the_problem_and_exits_2(args: list[str], words: str) -> None:
    result = runner.invoke(app, [*TINY, *args], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_a_malformed_trace_row_is_named_by_line(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,100,5\n2.0,abc,5\n")
    result = runner.invoke(app, [*TINY, "--trace", str(trace), *URL])
    assert result.exit_code == 2
    assert f"{trace}:3: ContextTokens 'abc' is not a whole number" in result.output


def test_a_replayed_trace_runs_to_its_last_arrival_unless_a_duration_is_given(tmp_path) -> None:
    from bench.chat_load_run import DEFAULT_DURATION_S, ChatLoadOptions, load_spec
    from serving.engine_config import load_engine_config

    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,5\n95.5,100,5\n250.2,100,5\n")
    config = load_engine_config(REPO / "engine_configs" / "cpu-tiny.yaml")
    whole = load_spec(config, ChatLoadOptions(trace=trace, trace_speedup=2.0))
    assert whole.duration_s == 126.0 and len(whole.plans()) == 3
    cut = load_spec(config, ChatLoadOptions(trace=trace, trace_speedup=2.0, duration=60.0))
    assert cut.duration_s == 60.0 and len(cut.plans()) == 2
    assert load_spec(config, ChatLoadOptions(rate=1.0)).duration_s == DEFAULT_DURATION_S


def test_missing_engine_config() -> None:
    result = runner.invoke(app, ["chat-load", "--engine-config", "nope.yaml", "--rate", "1"])
    assert result.exit_code == 2 and "no such engine config file" in result.output


def test_summary_lines() -> None:
    q = {"p50": 10.0, "p95": 20.0, "p99": 30.0, "n": 4}
    text = format_summary({
        "run_id": "r1", "replicas": ["a"], "window_s": 10.0, "achieved_rate": 0.4, "sessions": 2,
        "requests": {"sent": 4, "ok": 3, "failed": 1, "cancelled": 0, "not_sent": 0},
        "ttft_ms": q, "itl_ms": q, "e2e_ms": {"p50": None, "p95": None, "p99": None, "n": 0},
        "prompt_tokens_mean": 812.0, "prefix_cache_hit_share": 0.75,
        "prompt_tokens_over_planned_p50": 1.0,
    })  # fmt: skip
    assert "4 requests in 10.0 s (0.40/s)" in text
    assert "ok 3  failed 1" in text
    assert "p99     30.0" in text and "E2E ms   p50        -" in text
    assert "prefix-cache hit share 0.75" in text and "(1.00 x planned)" in text
