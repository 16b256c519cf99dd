"""`nightshift simulate`: engine configs in, OUT.json and records out, bad input refused clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from flows.cli_simulate import register
from scheduler.latency_model import LatencyModel
from serving.engine_config import load_engine_config
from serving.engine_profile import dtypes, kv_capacity
from serving.engine_profile import parse_assignment as parse_override
from warehouse.run_files import read_meta

CONFIGS = Path(__file__).resolve().parents[2] / "engine_configs"
PROFILE = str(CONFIGS / "h100x2-llama-3.1-70b-fp8.yaml")
QUICK = ["--engine-config", PROFILE, "--chat-rate", "1", "--duration", "30"]


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app: a callback keeps `simulate` a subcommand."""

    register(app)
    return app


def simulate(*args: str):
    return CliRunner().invoke(_app(), ["simulate", *args])


def test_out_json_has_the_issue_shape(tmp_path):
    out = tmp_path / "out.json"
    result = simulate(*QUICK, "--batch-docs", "2", "--doc-tokens", "8000", "--json", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert set(summary) == {
        "chat",
        "batch",
        "preemptions",
        "kv_peak",
        "sim_seconds",
        "wall_seconds",
    }
    assert set(summary["chat"]["ttft_ms"]) == {"p50", "p95", "p99"}
    assert summary["sim_seconds"] == 30.0
    assert "SLO met" in result.stdout


@pytest.mark.parametrize(
    ("item", "parsed"),
    [
        ("enable-chunked-prefill=false", ("enable-chunked-prefill", False)),
        ("max-num-batched-tokens=512", ("max-num-batched-tokens", 512)),
        ("gpu-memory-utilization=0.85", ("gpu-memory-utilization", 0.85)),
        ("scheduling-policy=fcfs", ("scheduling-policy", "fcfs")),
    ],
)
def test_overrides_parse_booleans_numbers_and_words(item, parsed):
    assert parse_override(item) == parsed


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--override", "max-num-batched-tokens=0"], "max-num-batched-tokens"),
        (["--override", "max_num_seqs=4"], "dash form"),
        (["--override", "no-equals-sign"], "KEY=VALUE"),
        (["--chat-rate", "-1"], "--chat-rate"),
        (["--controller", "smart"], "none, static, budget, slo"),
        (["--batch-mode", "halves"], "--batch-mode"),
        (["--set", "chat.outputtokens=5"], "unknown setting"),
        (["--latency-model", "/nonexistent/fit.json"], "not a latency model file"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(args, words):
    result = simulate(*QUICK, *args)
    assert result.exit_code == 2
    assert words in result.stderr


def test_a_chat_rate_and_a_trace_together_are_refused(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,10\n")
    result = simulate(*QUICK, "--chat-trace", str(trace))
    assert result.exit_code == 2 and "not both" in result.stderr


def test_a_malformed_trace_names_its_line(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,10\n1,many,10\n")
    result = simulate("--engine-config", PROFILE, "--chat-trace", str(trace))
    assert result.exit_code == 2 and "t.csv:3" in result.stderr


@pytest.mark.parametrize("config", ["cpu-small.yaml", "cpu-small-fp32.yaml"])
def test_a_cpu_replica_needs_a_fitted_model_and_runs_with_one(tmp_path, config):
    cpu = ["--engine-config", str(CONFIGS / config), "--chat-rate", "2"]
    cpu += ["--duration", "20", "--context-tokens", "200", "--system-prompt-tokens", "300"]
    refused = simulate(*cpu)
    assert refused.exit_code == 2 and "--latency-model" in refused.stderr
    fit = tmp_path / "fit.json"
    LatencyModel(2e-4, 0.02, 1e-8, 1e-7, 0.005).to_json(fit)
    out = tmp_path / "out.json"
    result = simulate(*cpu, "--latency-model", str(fit), "--json", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["chat"]["requests"] > 0


def test_a_float32_replica_holds_half_the_kv_tokens_of_its_bf16_twin():
    """vLLM keeps KV in the model's dtype when kv-cache-dtype is auto."""
    bf16, fp32 = (
        load_engine_config(CONFIGS / n) for n in ("cpu-small.yaml", "cpu-small-fp32.yaml")
    )
    assert dtypes(fp32) == ("fp32", "fp32") and dtypes(bf16) == ("bf16", "bf16")
    assert kv_capacity(fp32) * 2 == kv_capacity(bf16)


def test_records_make_a_warehouse_run_directory(tmp_path):
    run = tmp_path / "runs" / "sim-static"
    args = ["--batch-docs", "2", "--doc-tokens", "8000", "--policy", "static"]
    args += ["--static-seats", "1", "--static-chunk", "700", "--records", str(run)]
    result = simulate(*QUICK, *args)
    assert result.exit_code == 0, result.output
    meta = read_meta(run)
    assert (meta.run_id, meta.policy, meta.ended) == ("sim-static", "static", 30.0)
    decisions = pq.read_table(run / "decisions.parquet").to_pydict()
    assert set(decisions["chunk_tokens"]) == {700} and set(decisions["batch_seats"]) == {1}
    requests = pq.read_table(run / "requests.parquet").to_pydict()
    assert "batch" in requests["class"] and "chat" in requests["class"]
    assert pq.read_table(run / "token_gaps.parquet").num_rows > 0


def test_the_slo_controller_drives_batch_admission(tmp_path):
    run = tmp_path / "runs" / "sim-slo"
    result = simulate(*QUICK, "--batch-docs", "2", "--policy", "slo", "--records", str(run))
    assert result.exit_code == 0, result.output
    reasons = set(pq.read_table(run / "decisions.parquet").column("reason").to_pylist())
    assert reasons and "uncontrolled" not in reasons and "static" not in reasons


def test_the_older_controller_spelling_still_chooses_the_policy(tmp_path):
    run = tmp_path / "runs" / "sim-old"
    args = ["--batch-docs", "1", "--controller", "budget", "--records", str(run)]
    result = simulate(*QUICK, *args)
    assert result.exit_code == 0, result.output
    assert read_meta(run).policy == "budget"


def test_a_trace_is_replayed_whole_unless_a_duration_is_given(tmp_path):
    trace = tmp_path / "trace.csv"
    rows = "".join(f"{t},1200,40\n" for t in range(0, 900, 30))  # last arrival at 870 s
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    out = tmp_path / "out.json"
    base = ["--engine-config", PROFILE, "--chat-trace", str(trace), "--json", str(out)]
    assert simulate(*base).exit_code == 0
    assert json.loads(out.read_text())["sim_seconds"] == 871
    assert simulate(*base, "--trace-speedup", "2").exit_code == 0
    whole = json.loads(out.read_text())
    assert whole["sim_seconds"] == 436 and whole["chat"]["requests"] == 30
    assert simulate(*base, "--duration", "100").exit_code == 0
    assert json.loads(out.read_text())["sim_seconds"] == 100


def test_json_dash_writes_the_summary_to_stdout_alone():
    result = CliRunner().invoke(_app(), ["simulate", *QUICK, "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["chat"]["requests"] > 0
