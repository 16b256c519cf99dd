"""The nightly summarization flow: check replicas → plan caps → run pipeline → load → report.

Each step is a Prefect task with the retries that suit it: the pipeline resumes where it stopped,
so retrying it never redoes a finished document; loading replaces a run's rows, so it is safe to
repeat. The run id and the deadline follow from the night's scheduled start (`pipelines/night.py`),
so a retried or rerun night resumes the same run. Results land as Prefect artifacts (the Markdown
report and a latency table) beside the files under `results/`.

Replica credentials come from the environment only (`serving/replica_auth.py`): flow parameters
are stored by the Prefect server and shown in its UI, so a key must never be one.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.replicas import read_replica_file, replicas_for_run
from pipelines.config import PipelineConfig
from pipelines.job import JobResult, JobSpec, run_job
from pipelines.night import deadline_after, night_run_id
from pipelines.run_metrics import RunMetrics, serving_night
from scheduler.slo import SLO
from serving.engine_config import load_engine_config
from serving.prometheus_selectors import DEFAULT_SELECTOR, check_selectors, replica_selectors
from serving.replica_auth import ReplicaAuth


@task(retries=2, retry_delay_seconds=5)
def plan_caps(latency_model: str | None, slo: SLO, max_model_len: int) -> list[dict]:
    """The largest batch chunk the engine plug-in would grant at each prefix position with the
    step target at the ITL SLO and one chat decoding: a preview, logged before the run starts, of
    how much slower a long document's prefill gets as it goes deeper."""
    if latency_model is None:
        return []
    from scheduler.latency_model import LatencyModel, largest_chunk_within

    model = LatencyModel.from_json(latency_model)
    budget = slo.chat_itl_p99_ms / 1000
    points = sorted({0, max_model_len // 4, max_model_len // 2, max_model_len * 3 // 4})
    return [
        {
            "prefix_tokens": p,
            "chunk_tokens": largest_chunk_within(
                model, budget, p, decode_seqs=1, decode_context_tokens=1024, max_chunk=max_model_len
            ),
        }
        for p in points
    ]


@task(retries=1, retry_delay_seconds=10, cache_policy=NO_CACHE)
def run_pipeline(spec: JobSpec) -> JobResult:
    """Never cached: a retry must resume the run, and the spec holds live metrics and auth. A
    retry, like every run, starts by giving back what the attempt before left in this process."""
    return run_job(spec)


@task(retries=2, retry_delay_seconds=5)
def load_warehouse(results: str, run_id: str) -> dict:
    from warehouse.load import load_results

    return load_results(results, [run_id])[0].rows


@task(retries=1)
def publish_report(results: str, run_id: str, out: str | None = None) -> dict:
    from flows.report import write_report
    from warehouse.db import connect, db_path
    from warehouse.queries import rows

    files = write_report(results, run_id, out)
    create_markdown_artifact(
        key=_key(run_id, "report"),
        markdown=files.markdown.read_text(),
        description=f"nightshift run {run_id}",
    )
    con = connect(db_path(results), read_only=True)
    try:
        latency = rows(con, "report_latency", run_id=run_id)
    finally:
        con.close()
    create_table_artifact(
        key=_key(run_id, "latency"),
        table=latency,
        description="p50/p95/p99 of TTFT, ITL and E2E per class",
    )
    return {"markdown": str(files.markdown), "html": str(files.html)}


def _key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    safe = "".join(c if c.isalnum() else "-" for c in run_id.lower())
    return f"nightshift-{safe}-{what}"[:100]


@flow(name="nightly_summarization", log_prints=True)
def nightly_summarization(
    corpus: str,
    engine_config: str,
    replica_urls: list[str] | None = None,
    replica_file: str | None = None,
    replicas: int = 1,
    run_id: str | None = None,
    results: str = "results",
    policy: str = "slo",
    latency_model: str | None = None,
    slo: SLO | None = None,
    pipeline: PipelineConfig | None = None,
    static_caps: tuple[int, int] = (4, 2048),
    metrics_port: int | None = None,
    pushgateway: str | None = None,
    prometheus_url: str | None = None,
    prometheus_selector: str = DEFAULT_SELECTOR,
    deadline: str | None = None,
    timezone: str = "UTC",
    show_progress: bool = True,
    budget: tuple[int, float] = (4, 40.0),
    stop_after_s: float | None = None,
) -> dict:
    """Tonight's corpus, summarized on the shared replicas without breaking chat's SLO.

    `run_id` defaults to `nightly-YYYY-MM-DD`, the night's scheduled date in `timezone`;
    `deadline` (HH:MM in `timezone`) stops batch admission, and the night ends partial."""
    log = get_run_logger()
    config = load_engine_config(engine_config)
    start = scheduled_start()
    run_id = run_id or night_run_id(start, timezone)
    deadline_ts = deadline_after(start, deadline, timezone).timestamp() if deadline else None
    urls = list(replica_urls or []) + (read_replica_file(replica_file) if replica_file else [])
    auth = ReplicaAuth.from_env()
    slo = slo or SLO()
    pipeline = pipeline or default_pipeline(config)
    metrics = RunMetrics(run_id)
    with serving_night(metrics, metrics_port, pushgateway, deadline_ts) as night:
        if metrics.port is not None:
            log.info("metrics of run %s on port %d", run_id, metrics.port)
        with replicas_for_run(
            config,
            engine_config,
            urls,
            replicas,
            state_dir=str(Path(results) / "engines"),
            auth=auth,
        ) as live:
            log.info("run %s on %s", run_id, ", ".join(url for _, url in live))
            preview = plan_caps(latency_model, slo, pipeline.max_model_len)
            log.info("batch chunk by prefix position at the ITL SLO, chat idle: %s", preview)
            sensor = None
            if prometheus_url:
                check_selectors(prometheus_url, replica_selectors(prometheus_selector, live))
                sensor = {
                    "kind": "prometheus",
                    "url": prometheus_url,
                    "selector": prometheus_selector,
                    "window_s": slo.window_s,
                }
            job = run_pipeline(
                JobSpec(
                    corpus=corpus,
                    engine_config=engine_config,
                    replicas=live,
                    run_id=run_id,
                    results=results,
                    pipeline=pipeline,
                    slo=slo,
                    policy=policy,
                    latency_model=latency_model,
                    static_caps=static_caps,
                    budget=budget,
                    engine_state_dir=str(Path(results) / "engines"),
                    sensor=sensor,
                    stop_after_s=stop_after_s,
                    deadline_ts=deadline_ts,
                    metrics=metrics,
                    auth=auth,
                    show_progress=show_progress,
                )
            )
        loaded = load_warehouse(results, run_id)
        report = publish_report(results, run_id)
        night.value = "partial" if job.docs_stopped else "success"
    log.info(
        "run %s %s: %d done, %d failed, %d skipped, %d already done, %d left",
        run_id,
        night.value,
        job.docs_done,
        job.docs_failed,
        job.docs_skipped,
        job.docs_already_done,
        job.docs_stopped,
    )
    if job.docs_stopped:
        log.warning(
            "run %s is partial: %d documents left at the deadline; rerun with the same run id "
            "to finish them",
            run_id,
            job.docs_stopped,
        )
    return {
        "run_id": run_id,
        "outcome": night.value,
        "job": asdict(job) | {"run_dir": str(job.run_dir)},
        "loaded": loaded,
        "report": report,
    }


def scheduled_start() -> datetime:
    """When this flow run was scheduled to start (a deployment's cron slot; now, for a flow
    called directly), as an aware UTC datetime."""
    from prefect.runtime import flow_run

    start = flow_run.scheduled_start_time
    return datetime.fromtimestamp(start.timestamp(), UTC)


def default_pipeline(config) -> PipelineConfig:
    """Pipeline settings that follow the engine config: its context length, and exact output
    lengths for the local random-weight models (which would otherwise stop at random)."""
    max_len = int(config.flag("max-model-len", 32_768))
    return PipelineConfig(max_model_len=max_len, ignore_eos=config.model.local_name is not None)
