"""`nightshift run` (tonight's job, now) and `nightshift schedule` (the nightly deployment)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import typer

from flows.cli_engine import fail, load_config_or_exit, slo_from_options
from serving.prometheus_selectors import DEFAULT_SELECTOR
from serving.replica_auth import API_KEY_ENV


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("schedule")(schedule)


ReplicaFile = typer.Option(
    None, help="A file of replica URLs, one per line (# comments), used with any --replica-url."
)
ApiKey = typer.Option(
    None,
    envvar=API_KEY_ENV,
    show_envvar=True,
    help="The replicas' API key, sent as a bearer token; prefer the environment variable "
    "(a command line is visible to every user of the host). Never logged or written down.",
)
Header = typer.Option(
    None, help="An extra header for every request to the replicas, 'Name: value' (repeatable)."
)
MetricsPort = typer.Option(
    None, help="Serve the night's metrics, the Gate's included, on this port (0.0.0.0)."
)
Pushgateway = typer.Option(None, help="Push the night's metrics here when it starts and ends.")
PrometheusUrl = typer.Option(
    None, help="Read the replicas through this Prometheus server instead of their /metrics."
)
PrometheusSelector = typer.Option(
    DEFAULT_SELECTOR,
    help="Label matchers of one replica's series in that Prometheus, filled in per replica from "
    "{name}, {instance} (host:port), {host}, {port}, {url}.",
)
Deadline = typer.Option(
    None, help="HH:MM after the night's start when batch admission stops; the night is partial."
)
Timezone = typer.Option("UTC", help="Timezone of --deadline and of the default run id's date.")


def run(
    corpus: Path = typer.Option(..., help="Corpus file: Parquet or JSONL with doc_id and text."),
    engine_config: Path = typer.Option(..., help="Engine config of the replicas."),
    replica_url: list[str] = typer.Option(
        None, help="A running replica to use (repeatable); none: start replicas for the run."
    ),
    replica_file: Path = ReplicaFile,
    replicas: int = typer.Option(1, min=1, help="Replicas to start when no URL is given."),
    run_id: str = typer.Option(
        None, help="Run id; the same id resumes an earlier run. Default: nightly-YYYY-MM-DD."
    ),
    results: Path = typer.Option(Path("results"), help="Where run files and the DuckDB file go."),
    policy: str = typer.Option(
        "slo",
        help="Admission policy: slo (the controller steers the engine plug-in), budget (the "
        "plug-in at a fixed target), static (fixed seats, stock engine) or none.",
    ),
    latency_model: Path = typer.Option(
        None,
        help="Latency fit the plug-in prices chunks with; default: the engine config's "
        "latency_fit (engine_configs/fits/<name>.json).",
    ),
    itl_slo_ms: float = typer.Option(None, help="Chat ITL p99 SLO in ms."),
    ttft_slo_ms: float = typer.Option(None, help="Chat TTFT p99 SLO in ms."),
    e2e_slo_ms: float = typer.Option(
        None, help="Chat end-to-end p99 SLO in ms (default: none, only ITL and TTFT)."
    ),
    static_seats: int = typer.Option(4, help="Seats for policy static or budget."),
    static_chunk: int = typer.Option(2048, help="Chunk tokens for policy static."),
    budget_target_ms: float = typer.Option(40.0, help="Batch step target for policy budget."),
    metrics_port: int = MetricsPort,
    pushgateway: str = Pushgateway,
    prometheus_url: str = PrometheusUrl,
    prometheus_selector: str = PrometheusSelector,
    deadline: str = Deadline,
    timezone: str = Timezone,
    api_key: str = ApiKey,
    header: list[str] = Header,
) -> None:
    """Run the nightly summarization now and print the run id."""
    from flows.nightly import default_pipeline, nightly_summarization
    from flows.prefect_server import tie_temporary_server
    from pipelines.ray_session import stop_on_sigterm
    from serving.replica_targets import ReplicaLookupError, configured_fit

    config = load_config_or_exit(engine_config)
    try:
        latency_model = latency_model or configured_fit(engine_config, config)
    except ReplicaLookupError as exc:
        raise fail(str(exc)) from None
    _check_night(deadline, timezone, prometheus_selector)
    _use_auth(api_key, header or [])
    urls = (replica_url or []) + _replica_file_urls(replica_file)
    run_id = run_id or _tonight(timezone)
    _check_inputs(corpus, engine_config, config, urls, run_id, results, policy, latency_model)
    slo = slo_from_options(itl_slo_ms, ttft_slo_ms, e2e_slo_ms)
    tie_temporary_server()  # a killed run leaves no Prefect server behind
    stop_on_sigterm()  # a supervisor's stop ends the run as Ctrl-C does
    out = nightly_summarization(
        corpus=str(corpus),
        engine_config=str(engine_config),
        replica_urls=urls or None,
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
        prometheus_url=prometheus_url,
        prometheus_selector=prometheus_selector,
        deadline=deadline,
        timezone=timezone,
    )
    job = out["job"]
    partial = (
        f", PARTIAL: {job['docs_stopped']} left at the deadline" if job["docs_stopped"] else ""
    )
    typer.echo(
        f"run {out['run_id']}: {job['docs_done']} done, {job['docs_failed']} failed, "
        f"{job['docs_skipped']} skipped, {job['docs_already_done']} already done{partial}; "
        f"{job['batch_tokens']:,} batch tokens in {job['seconds']:.0f} s"
    )
    typer.echo(f"report: {out['report']['html']}")
    typer.echo(out["run_id"])


def _tonight(timezone: str) -> str:
    """The run id the flow would pick now, so that resuming it is checked before any work."""
    from datetime import UTC, datetime

    from pipelines.night import night_run_id

    return night_run_id(datetime.now(UTC), timezone)


def check_policy_choice(policy: str) -> None:
    """`--policy` against the policy factory's names (`scheduler/policy_factory.py`)."""
    from scheduler.policy_factory import PolicyError, check_policy_name

    try:
        check_policy_name(policy, "--policy")
    except PolicyError as exc:
        raise fail(str(exc)) from None


def _check_night(deadline: str | None, timezone: str, selector: str) -> None:
    from pipelines.night import NightError, parse_deadline, zone
    from serving.prometheus_selectors import SelectorError, check_template

    try:
        zone(timezone)
        if deadline is not None:
            parse_deadline(deadline)
        check_template(selector)
    except (NightError, SelectorError) as exc:
        raise fail(str(exc)) from None


def _use_auth(api_key: str | None, headers: list[str]) -> None:
    """Put the replicas' key and headers where the flow reads them: this process's environment,
    never the flow's parameters (which Prefect stores)."""
    from serving.replica_auth import AuthError, ReplicaAuth, parse_headers

    try:
        parsed = parse_headers(headers)
        auth = ReplicaAuth.from_env()
    except AuthError as exc:
        raise fail(str(exc)) from None
    auth = ReplicaAuth(api_key or auth.api_key, parsed or auth.headers)
    os.environ.update(auth.to_env())


def _replica_file_urls(path: Path | None) -> list[str]:
    from flows.replicas import ReplicaUnreachable, read_replica_file

    if path is None:
        return []
    try:
        return read_replica_file(path)
    except ReplicaUnreachable as exc:
        raise fail(str(exc)) from None


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
    from pipelines.ray_session import RayAddressError, ray_address
    from pipelines.run_store import RunMismatch, check_resumable
    from serving.vllm_flags_check import VllmFlagError, check_vllm_flags

    check_policy_choice(policy)
    try:
        ray_address()
    except RayAddressError as exc:
        raise fail(str(exc)) from None
    if policy in ("slo", "budget") and latency_model is None:
        raise fail(
            f"--policy {policy} needs a latency fit and the engine config has none: fit one with "
            "`nightshift calibrate --engine-config CONFIG --out engine_configs/fits/NAME.json` "
            "or pass --latency-model FIT.json"
        )
    if latency_model is not None and not latency_model.is_file():
        raise fail(f"--latency-model {latency_model}: no such file")
    from serving.replica_auth import ReplicaAuth

    try:
        read_corpus(corpus)
        for url in urls:
            check_replica(url, config.model.served_name, auth=ReplicaAuth.from_env())
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
    metrics_port: int = MetricsPort,
    pushgateway: str = Pushgateway,
    prometheus_url: str = PrometheusUrl,
    prometheus_selector: str = typer.Option(
        None, help='As for `run`; default: the parameters\' or instance="{instance}".'
    ),
    deadline: str = Deadline,
    timezone: str = typer.Option(None, help="As for `run`; default: the parameters' or UTC."),
    api_key: str = ApiKey,
    header: list[str] = Header,
    policy: str = typer.Option(
        None, help="Admission policy of every night (none, static, budget or slo), over the file's."
    ),
) -> None:
    """Serve the nightly deployment: Prefect runs the flow on `cron` until stopped. Options
    given here override the same parameters in the file."""
    from flows.nightly import nightly_summarization

    if not parameters.is_file():
        raise fail(f"--parameters {parameters}: no such file")
    try:
        params = json.loads(parameters.read_text())
    except ValueError as exc:
        raise fail(f"--parameters {parameters}: not JSON ({exc})") from None
    if policy is not None:
        check_policy_choice(policy)
    overrides = {
        "policy": policy,
        "metrics_port": metrics_port,
        "pushgateway": pushgateway,
        "prometheus_url": prometheus_url,
        "prometheus_selector": prometheus_selector,
        "deadline": deadline,
        "timezone": timezone,
    }
    params |= {k: v for k, v in overrides.items() if v is not None}
    check_flow_parameters(params, nightly_summarization.fn, str(parameters))
    _check_night(
        params.get("deadline"),
        params.get("timezone", "UTC"),
        params.get("prometheus_selector", DEFAULT_SELECTOR),
    )
    _use_auth(api_key, header or [])
    nightly_summarization.serve(name=name, cron=cron, parameters=params)


def check_flow_parameters(params: object, fn, source: str) -> None:
    """Parameters the flow has, and the ones it needs: Prefect would fail each night's run on
    them, hours after the deployment was made."""
    if not isinstance(params, dict):
        raise fail(f"{source}: expected a JSON object of flow parameters")
    signature = inspect.signature(fn).parameters
    unknown = sorted(set(params) - set(signature))
    if unknown:
        raise fail(
            f"{source}: the flow has no parameter {unknown[0]!r}; it takes " + ", ".join(signature)
        )
    missing = [
        n for n, p in signature.items() if p.default is inspect.Parameter.empty and n not in params
    ]
    if missing:
        raise fail(f"{source}: the flow needs {', '.join(missing)}")
