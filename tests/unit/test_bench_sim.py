"""`nightshift bench --sim`: the real bench's scenarios, OUT.json, records and report, simulated."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import typer
from typer.testing import CliRunner

from bench.scenarios import ScenarioRun
from bench.scenarios import score as real_score
from bench.sim_scenarios import (
    SimBench,
    chat_workload,
    run_sim_scenarios,
    scenario_records,
    score,
    simulate_scenario,
)
from bench.verdicts import step_chunk_cap
from flows.cli_bench import register
from scheduler.admission import NoAdmissionControl
from scheduler.slo import SLO
from serving.engine_profile import engine_params, load_profile, step_model
from simulator.config import sim_config

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"
SCENARIOS = {"chat-only", "uncontrolled", "static-engine", "static-budget", "controlled"}
QUANTILES = {"mean", "median", "p50", "p90", "p95", "p99", "p99.9"}
"""The statistics of every latency, as vLLM's serving benchmark gives them."""


def _bench(*args: str, profile: Path | str = PROFILE):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app: a callback keeps `bench` a subcommand."""

    register(app)
    return CliRunner().invoke(app, ["bench", "--sim", "--engine-config", str(profile), *args])


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """Two simulated minutes with a few 80k-token documents: long enough for attention late in a
    document to show in chat ITL when nothing holds batch back."""
    results = tmp_path_factory.mktemp("bench-sim")
    out_path = results / "out.json"
    result = _bench(
        "--duration",
        "120",
        "--docs",
        "8",
        "--static-sweep",
        "1x2048,4x4096",
        "--budget-sweep",
        "4x0.5",
        "--results",
        str(results),
        "--json",
        str(out_path),
    )
    assert result.exit_code == 0, result.output
    return json.loads(out_path.read_text()), results, result.output


def test_out_csv_beside_out_json_holds_one_row_per_scenario(sim_run) -> None:
    import csv

    out, results, output = sim_run
    with (results / "out.csv").open() as fh:
        rows = {row["scenario"]: row for row in csv.DictReader(fh)}
    assert set(rows) == set(out["scenarios"])
    row, scored = rows["controlled"], out["scenarios"]["controlled"]
    assert float(row["chat.ttft_ms.p99.9"]) == pytest.approx(scored["chat"]["ttft_ms"]["p99.9"])
    assert float(row["batch.slo_batch_tokens_per_s"]) == pytest.approx(
        scored["batch"]["slo_batch_tokens_per_s"]
    )
    assert f"OUT.csv: {results / 'out.csv'}" in output


def test_out_json_has_the_real_bench_shape(sim_run) -> None:
    out, _, _ = sim_run
    assert out["mode"] == "sim" and out["profile"] == "h100x2-llama-3.1-70b-fp8"
    assert set(out["scenarios"]) == SCENARIOS
    for s in out["scenarios"].values():
        chat, batch = s["chat"], s["batch"]
        assert all(set(chat[k]) == QUANTILES for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"))
        assert 0.0 <= chat["slo_windows_met"] <= 1.0 and chat["errors"] == 0
        assert chat["goodput_slos_ms"] == {"ttft": 1000.0, "tpot": 50.0}
        assert 0.0 <= chat["goodput"] <= chat["requests"] / 120 + 1e-9
        assert {"tokens_per_s", "docs_done", "slo_batch_tokens_per_s"} <= set(batch)
        assert batch["slo_batch_tokens_per_s"] <= batch["tokens_per_s"] + 1e-9
    caps = out["scenarios"]["static-engine"]["caps"]
    assert caps in {"static-engine-1x2048", "static-engine-4x4096"}
    assert out["scenarios"]["static-budget"]["caps"] == "static-budget-4x25ms"
    assert out["slo"]["chat_itl_p99_ms"] == 50.0 and out["slo"]["chat_ttft_p99_ms"] == 1000.0
    summary = out["summary"]
    assert {
        "controlled_vs_uncontrolled_batch",
        "controlled_vs_static_engine_batch",
        "controlled_vs_static_budget_batch",
        "uncontrolled_itl_p99_over_slo",
        "bound_tokens_per_s",
        "controlled_fraction_of_bound",
    } <= set(summary)
    goodput = out["scenarios"]["controlled"]["batch"]["slo_batch_tokens_per_s"]
    assert summary["bound_tokens_per_s"] > 0
    assert summary["controlled_fraction_of_bound"] == pytest.approx(
        goodput / summary["bound_tokens_per_s"]
    )


def test_uncontrolled_batch_hurts_chat_itl_more_than_the_controller(sim_run) -> None:
    scenarios = sim_run[0]["scenarios"]
    uncontrolled = scenarios["uncontrolled"]["chat"]["itl_ms"]["p99"]
    assert uncontrolled > scenarios["controlled"]["chat"]["itl_ms"]["p99"]
    assert uncontrolled > scenarios["chat-only"]["chat"]["itl_ms"]["p99"]


def test_every_run_reaches_the_warehouse_and_the_report(sim_run) -> None:
    out, results, stdout = sim_run
    con = duckdb.connect(str(results / "nightshift.duckdb"), read_only=True)
    try:
        loaded = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
        (chat_rows,) = con.execute("SELECT count(*) FROM requests WHERE class = 'chat'").fetchone()
    finally:
        con.close()
    assert loaded == set(out["run_ids"].values())
    # chat-only, uncontrolled, two static-engine caps, one static-budget, controlled
    assert len(loaded) == 6 and chat_rows > 0
    report = results / "bench" / out["bench_id"]
    assert (report / "bench.html").is_file()
    assert "static-engine-4x4096" in (report / "bench.md").read_text()
    assert "| controlled |" in stdout


def _one_minute(rate: float = 5.0, docs: int = 2, **bench) -> SimBench:
    """A simulated minute of the 70B profile: chat at `rate`, `docs` 20k-token documents."""
    profile = load_profile(PROFILE, [])
    base = sim_config(
        profile.name,
        engine=engine_params(profile),
        chat=chat_workload(rate, 1.0).model_dump(),
        batch={"docs": docs, "doc_tokens": 20_000},
        duration_s=60.0,
    )
    return SimBench(base=base, model=step_model(profile, None), profile=profile.name, **bench)


def test_scoring_matches_the_real_bench_on_the_same_records() -> None:
    bench = _one_minute(results="unused")
    slo = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, window_s=20)
    result = simulate_scenario(bench, "uncontrolled", NoAdmissionControl(), slo, docs=2)
    run = scenario_records(result, "uncontrolled")
    real = real_score(
        ScenarioRun(run.name, run.run_id, 0.0, 60.0, run.chat, run.batch_rows, run.docs_done), slo
    )
    ours = score(run, slo, 60.0)
    ours["chat"].pop("itl_source", None)
    real["chat"].pop("itl_source", None)
    assert ours == real
    assert len(run.chat) > 0 and len(run.batch_rows) > 0


def test_chat_only_derives_the_slo_when_none_is_given(tmp_path) -> None:
    bench = _one_minute(
        docs=0, scenarios=("chat-only",), slo_factor=2.0, window_s=30.0, results=str(tmp_path)
    )
    out = run_sim_scenarios(bench)
    itl = out["scenarios"]["chat-only"]["chat"]["itl_ms"]["p99"]
    assert out["slo"]["chat_itl_p99_ms"] == pytest.approx(round(itl * 2.0, 1))
    assert out["slo"]["window_s"] == 30.0
    assert out["scenarios"]["chat-only"]["chat"]["slo_windows_met"] == 1.0


def test_bound_chunk_is_what_one_engine_step_can_carry() -> None:
    assert step_chunk_cap(272, 200, 32_768, 36.4) == 200  # the threshold caps one request's chunk
    assert step_chunk_cap(272, 0, 32_768, 36.4) == 236
    assert step_chunk_cap(16, 0, 32_768, 40) == 1
    assert step_chunk_cap(None, 0, 32_768, 10) == 32_768  # no chunked prefill: whole prompts


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--static-sweep", "2by1024"], "SEATSxCHUNK"),
        (["--duration", "0"], "--duration"),
        (["--scenarios", "chat-only,clever"], "choose from"),
        (["--latency-model", "/nonexistent/fit.json"], "not a latency model file"),
    ],
)
def test_bad_input_names_the_problem(args, words, tmp_path) -> None:
    result = _bench("--results", str(tmp_path), "--json", str(tmp_path / "o.json"), *args)
    assert result.exit_code == 2
    assert words in result.output
    assert not (tmp_path / "o.json").exists()


def test_a_cpu_profile_without_a_fit_says_how_to_get_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the default fit is looked up under engine_configs/fits
    result = _bench("--results", str(tmp_path), profile="engine_configs/cpu-tiny.yaml")
    assert result.exit_code == 2
    assert "nightshift calibrate" in result.output


def test_an_e2e_slo_is_added_to_the_slo_and_judges_every_scenario(tmp_path) -> None:
    def chat_only(*slo: str) -> dict:
        out = tmp_path / f"out{len(slo)}.json"
        args = ("--duration", "300", "--docs", "0", "--scenarios", "chat-only", *slo)
        result = _bench(*args, "--results", str(tmp_path), "--json", str(out))
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())

    alone = chat_only()
    e2e_p99 = alone["scenarios"]["chat-only"]["chat"]["e2e_ms"]["p99"]
    tight = chat_only("--e2e-slo-ms", f"{e2e_p99 / 2:.0f}")
    assert alone["slo"]["chat_e2e_p99_ms"] is None
    assert tight["slo"]["chat_e2e_p99_ms"] == pytest.approx(e2e_p99 / 2, abs=1)
    assert alone["scenarios"]["chat-only"]["chat"]["slo_windows_met"] == 1.0
    assert tight["scenarios"]["chat-only"]["chat"]["slo_windows_met"] < 1.0


def test_the_jobs_sections_reach_every_scenario_but_static_engine(tmp_path) -> None:
    from warehouse.run_files import read_table, run_dir

    bench = _one_minute(
        rate=2.0, results=str(tmp_path), scenarios=("chat-only", "static-engine", "controlled"),
        static_sweep=((2, 8192),), section_tokens=4096,
        slo=SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000, window_s=20),
    )  # fmt: skip
    out = run_sim_scenarios(bench)
    assert out["section_tokens"] == 4096

    def longest_prompt(run_id: str) -> int:
        rows = read_table(run_dir(tmp_path, run_id), "requests").to_pylist()
        return max(r["prompt_tokens"] for r in rows if r["class"] == "batch")

    sections, static = (longest_prompt(out["run_ids"][s]) for s in ("controlled", "static-engine"))
    instruction = bench.base.batch.instruction_tokens
    assert sections <= 4096 + instruction < 8192 < static, (sections, static)
