"""`nightshift run` (tonight's job, now) and `nightshift schedule` (the nightly deployment)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from flows.cli_engine import fail, load_config_or_exit


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("schedule")(schedule)


def run(
    corpus: Path = typer.Option(..., help="Corpus file: Parquet or JSONL with doc_id and text."),
    engine_config: Path = typer.Option(..., help="Engine config of the replicas."),
    replica_url: list[str] = typer.Option(
        None, help="A running replica to use (repeatable); none: start replicas for the run."
    ),
    replicas: int = typer.Option(1, min=1, help="Replicas to start when no URL is given."),
    run_id: str = typer.Option(None, help="Run id; the same id resumes an earlier run."),
    results: Path = typer.Option(Path("results"), help="Where run files and the DuckDB file go."),
    policy: str = typer.Option(
        "slo",
        help="Admission policy: slo (the controller steers the engine plug-in), budget (the "
        "plug-in at a fixed target), static (fixed seats, stock engine) or none.",
    ),
    latency_model: Path = typer.Option(
        None,
        help="Latency fit the plug-in prices chunks with; default: the engine config's "
        "(engine_configs/fits/<name>.json).",
    ),
    itl_slo_ms: float = typer.Option(None, help="Chat ITL p99 SLO in ms."),
    ttft_slo_ms: float = typer.Option(None, help="Chat TTFT p99 SLO in ms."),
    static_seats: int = typer.Option(4, help="Seats for policy static or budget."),
    static_chunk: int = typer.Option(2048, help="Chunk tokens for policy static."),
    budget_target_ms: float = typer.Option(40.0, help="Batch step target for policy budget."),
    metrics_port: int = typer.Option(None, help="Serve the run's Prometheus metrics here."),
    pushgateway: str = typer.Option(None, help="Push the run's metrics here at the end."),
) -> None:
    """Run the nightly summarization now and print the run id."""
    from flows.nightly import default_pipeline, nightly_summarization
    from flows.prefect_server import tie_temporary_server
    from scheduler.slo import SLO
    from serving.replica_targets import fit_path

    config = load_config_or_exit(engine_config)
    fit = fit_path(engine_config, config.name)
    latency_model = latency_model or (fit if fit.is_file() else None)
    _check_inputs(
        corpus, engine_config, config, replica_url or [], run_id, results, policy, latency_model
    )
    slo = SLO(
        **{
            k: v
            for k, v in (("chat_itl_p99_ms", itl_slo_ms), ("chat_ttft_p99_ms", ttft_slo_ms))
            if v is not None
        }
    )
    tie_temporary_server()  # a killed run leaves no Prefect server behind
    out = nightly_summarization(
        corpus=str(corpus),
        engine_config=str(engine_config),
        replica_urls=replica_url or None,
        replicas=replicas,
        run_id=run_id,
        results=str(results),
        policy=policy,
        latency_model=str(latency_model) if latency_model else None,
        slo=slo,
        pipeline=default_pipeline(config),
        static_caps=(static_seats, static_chunk),
        budget=(static_seats, budget_target_ms),
        metrics_port=metrics_port,
        pushgateway=pushgateway,
    )
    job = out["job"]
    typer.echo(
        f"run {out['run_id']}: {job['docs_done']} done, {job['docs_failed']} failed, "
        f"{job['docs_skipped']} skipped, {job['docs_already_done']} already done; "
        f"{job['batch_tokens']:,} batch tokens in {job['seconds']:.0f} s"
    )
    typer.echo(f"report: {out['report']['html']}")
    typer.echo(out["run_id"])


def _check_inputs(
    corpus: Path,
    engine_config: Path,
    config,
    urls: list[str],
    run_id: str | None,
    results: Path,
    policy: str,
    latency_model: Path | None,
) -> None:
    """Every input a run can get wrong, checked before any replica starts or document is read."""
    from flows.replicas import ReplicaUnreachable, check_replica
    from pipelines.corpus import CorpusError, read_corpus
    from pipelines.run_store import RunMismatch, check_resumable
    from serving.vllm_flags_check import VllmFlagError, check_vllm_flags

    if policy not in ("slo", "budget", "static", "none"):
        raise fail(f"unknown --policy {policy!r}; use none, static, budget or slo")
    if policy in ("slo", "budget") and latency_model is None:
        raise fail(
            f"--policy {policy} needs a latency fit and the engine config has none: fit one with "
            "`nightshift calibrate --engine-config CONFIG --out engine_configs/fits/NAME.json` "
            "or pass --latency-model FIT.json"
        )
    if latency_model is not None and not latency_model.is_file():
        raise fail(f"--latency-model {latency_model}: no such file")
    try:
        read_corpus(corpus)
        for url in urls:
            check_replica(url, config.model.served_name)
        if run_id:
            check_resumable(results, run_id, str(corpus))
        if not urls:  # the run starts its replicas: vLLM's own parser first, as `engine up` does
            check_vllm_flags(config, engine_config)
    except (CorpusError, ReplicaUnreachable, RunMismatch, VllmFlagError) as exc:
        raise fail(str(exc)) from None


def schedule(
    cron: str = typer.Option("0 1 * * *", help="When to run, as a cron expression."),
    name: str = typer.Option("nightly", help="Deployment name."),
    parameters: Path = typer.Option(
        ..., help="JSON file with the flow's parameters (corpus, engine_config, ...)."
    ),
) -> None:
    """Serve the nightly deployment: Prefect runs the flow on `cron` until stopped."""
    from flows.nightly import nightly_summarization

    if not parameters.is_file():
        raise fail(f"--parameters {parameters}: no such file")
    params = json.loads(parameters.read_text())
    nightly_summarization.serve(name=name, cron=cron, parameters=params)
