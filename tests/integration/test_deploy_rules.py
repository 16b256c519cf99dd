"""The operations pack under deploy/: Prometheus rules, their promtool unit tests, the Grafana board.

promtool checks the rules and runs their unit tests. Every nightshift metric they and the dashboard
name must be one the Gate's or the run's collectors export. Then a real Prometheus on loopback
scrapes those collectors (and a stand-in for vLLM's own metrics), loads the rules, and
answers every dashboard and rule expression: each must parse, evaluate and find data, so a typo in
a metric or label name fails here rather than as an empty panel at night. The stand-ins describe a
night in trouble (chat over its SLOs, a stale controller, a passed deadline, a failed night), so
every alert's expression matches real scraped series, job and instance labels included.

Needs the `prometheus` and `promtool` binaries (`make prometheus`).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    start_http_server,
)

from pipelines.gate_metrics import GateMetrics
from pipelines.run_metrics import RunMetrics
from scheduler.admission import Decision, Observation
from scheduler.slo import SLO
from serving.engine_site.engine_status import GAP_BOUNDS_S, TTFT_BOUNDS_S, Buckets
from tests.integration import prometheus_server as prom
from tests.integration.prometheus_server import INSTALL_HINT, prometheus_server

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "nightshift.rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "nightshift.rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "nightshift-dashboard.json"
README = DEPLOY / "README.md"

ALERTS = {
    "NightshiftChatItlOverSloWhileBatchRuns",
    "NightshiftChatTtftOverSloWhileBatchRuns",
    "NightshiftControllerStale",
    "NightshiftNightNotFinishedByDeadline",
    "NightshiftNightFailed",
}
RECORDS = {
    "nightshift:chat_itl_seconds:p99_1m",
    "nightshift:chat_ttft_seconds:p99_1m",
    "nightshift:batch_tokens:rate1m",
}
REPLICAS = ("r0", "r1")
MODEL = "nightshift-tiny"
ITL_SLO_S, TTFT_SLO_S = 0.1, 1.0
# What Grafana puts in for the dashboard's variables: one replica and one model picked.
VARIABLES = {
    "replica": REPLICAS[0],
    "model_name": MODEL,
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}
READY_TIMEOUT_S = 20.0

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason=f"`promtool` is not on PATH; {INSTALL_HINT}"
)
needs_prometheus = pytest.mark.skipif(
    prom.prometheus_binary() is None, reason=f"`prometheus` is not on PATH; {INSTALL_HINT}"
)


# -- the files themselves ------------------------------------------------------------------------


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every panel target."""
    return [
        (f"panel {p['id']} {p['title']!r} target {t['refId']}", t["expr"])
        for p in dashboard()["panels"]
        for t in p["targets"]
    ]


def substitute(expr: str) -> str:
    """The expression as Grafana sends it, with `$var` and `${var}` replaced."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown dashboard variable ${name} in {expr!r}"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in out


@needs_promtool
def test_promtool_rule_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))


def test_rules_define_the_recordings_and_alerts() -> None:
    by_kind = {"record": set(), "alert": set()}
    for rule in rules():
        kind = "record" if "record" in rule else "alert"
        by_kind[kind].add(rule[kind])
        if kind == "alert":
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert by_kind == {"record": RECORDS, "alert": ALERTS}


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in ALERTS:
        seen = [bool(c["exp_alerts"]) for c in cases if c["alertname"] == alert]
        assert True in seen and False in seen, (
            f"{alert}: tested firing {True in seen}, quiet {False in seen}"
        )
    tested = " ".join(
        case["expr"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("promql_expr_test", [])
    )
    assert all(record in tested for record in RECORDS)


def test_readme_explains_every_alert() -> None:
    text = README.read_text()
    for alert in ALERTS:
        assert alert in text, alert


def test_dashboard_structure() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    replica = variables["replica"]
    assert replica["type"] == "query"
    assert replica["query"]["query"] == "label_values(nightshift_batch_seats, replica)"
    model = variables["model_name"]
    assert model["type"] == "query" and "vllm:" in model["query"]["query"]

    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no target"
        for t in p["targets"]:
            assert t["expr"].strip(), f"panel {p['title']!r} target {t['refId']} has no expr"
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    exprs = " ".join(e for _, e in dashboard_exprs())
    assert "$replica" in exprs and "$model_name" in exprs
    for slo in ("nightshift_slo_chat_itl_p99_seconds", "nightshift_slo_chat_ttft_p99_seconds"):
        assert slo in exprs, f"{slo} not drawn beside its p99"


def exported_names() -> set[str]:
    """Every sample name the Gate's and the run's collectors export, fed as a night feeds them."""
    gate = GateMetrics()
    gate.set_slo(SLO())
    gate.record(Observation(t=1.0, replica="r0"), Decision(1, 0, reason="hold"), 0)
    gate.record_steps({"replica": "r0", "batch_tokens_per_step": 1.0})
    h = Buckets(GAP_BOUNDS_S).to_dict()
    gate.record_status("r0", {"chat_itl_seconds": h, "chat_ttft_seconds": h})
    run = RunMetrics("r")
    run.night_started(deadline_ts=1.0)
    run.night_ended("success", 2.0)
    run.observe_request({"class": "chat", "ttft_s": 0.1}, [0.01])
    run.document_done("done", 1)
    return {
        sample.name
        for registry in (gate.registry, run.registry)
        for family in registry.collect()
        for sample in family.samples
    }


def test_every_metric_named_in_deploy_is_exported_by_the_code() -> None:
    texts = [expr for _, expr in dashboard_exprs()] + [r["expr"] for r in rules()]
    texts += [
        v["query"]["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"
    ]
    named = {m for text in texts for m in re.findall(r"\bnightshift_[a-z0-9_]+", text)}
    missing = sorted(named - exported_names())
    assert not missing, f"named in deploy/ but exported by nothing: {missing}"


# -- against a real Prometheus --------------------------------------------------------------------


@needs_prometheus
@pytest.mark.prometheus
def test_every_expression_evaluates_on_real_scraped_series(night_in_trouble: str) -> None:
    url = night_in_trouble
    queries = [(where, substitute(expr)) for where, expr in dashboard_exprs()]
    queries += [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in rules()]
    now = time.time()
    failures = []
    with httpx.Client(base_url=url, timeout=5.0) as http:
        for where, expr in queries:
            instant = http.get("/api/v1/query", params={"query": expr}).json()
            ranged = http.get(
                "/api/v1/query_range",
                params={"query": expr, "start": now - 60, "end": now, "step": 5},
            ).json()
            if instant["status"] != "success" or ranged["status"] != "success":
                failures.append(f"{where}: {instant.get('error') or ranged.get('error')}")
            elif not instant["data"]["result"]:
                failures.append(f"{where}: no data for {expr}")
        for variable, series in (
            ("replica", "nightshift_batch_seats"),
            ("model_name", "vllm:num_requests_running"),
        ):
            values = http.get(f"/api/v1/label/{variable}/values", params={"match[]": series}).json()
            assert values["status"] == "success"
            assert VARIABLES[variable] in values["data"], (variable, values["data"])
    assert not failures, "\n".join(failures)


@needs_prometheus
@pytest.mark.prometheus
def test_loaded_rules_are_healthy_and_every_alert_matches(night_in_trouble: str) -> None:
    with httpx.Client(base_url=night_in_trouble, timeout=5.0) as http:
        groups = http.get("/api/v1/rules").json()["data"]["groups"]
        loaded = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(loaded) == RECORDS | ALERTS
        unhealthy = {n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"}
        assert not unhealthy, unhealthy
        itl = http.get(
            "/api/v1/query", params={"query": "nightshift:chat_itl_seconds:p99_1m"}
        ).json()["data"]["result"]
        p99 = {s["metric"]["replica"]: float(s["value"][1]) for s in itl}
        assert p99[REPLICAS[0]] > ITL_SLO_S > p99[REPLICAS[1]], p99
        active = alerts(http)
    states = {a["labels"]["alertname"]: a["state"] for a in active}
    assert set(states) == ALERTS, states
    for chat in (
        "NightshiftChatItlOverSloWhileBatchRuns",
        "NightshiftChatTtftOverSloWhileBatchRuns",
    ):
        replicas = [a["labels"].get("replica") for a in active if a["labels"]["alertname"] == chat]
        assert replicas == [REPLICAS[0]], (chat, replicas)  # the slow replica only
    assert states["NightshiftNightFailed"] == "firing"
    assert states["NightshiftNightNotFinishedByDeadline"] == "firing"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def night_in_trouble(tmp_path_factory) -> Iterator[str]:
    """A Prometheus with the rules loaded, scraping exporters of a night in trouble, once every
    dashboard query and rule has data to answer with; yields its URL."""
    if prom.prometheus_binary() is None:
        pytest.skip(f"`prometheus` is not on PATH; {INSTALL_HINT}")
    with exporters() as targets:
        workdir = tmp_path_factory.mktemp("prometheus")
        with prometheus_server(workdir, targets, rule_files=[RULES]) as url:
            wait_until_ready(url, targets=len(targets))
            yield url


@contextlib.contextmanager
def exporters() -> Iterator[dict[str, list[str]]]:
    """HTTP exporters on loopback for every series the dashboard and the rules read; yields the
    scrape jobs (name -> targets).

    `gate`, `tonight` and `last_night` are the product's own collectors (GateMetrics, and two
    RunMetrics: tonight's, running past its deadline, and last night's failed end as a
    Pushgateway keeps it), fed as the Gate and the job feed them; `vllm` stands in for a
    replica's own metrics. A thread keeps the plug-in's chat histograms and the batch counters
    moving, so rate() and histogram_quantile() have something to measure."""
    now = time.time()
    gate = GateMetrics()
    gate.set_slo(SLO(chat_itl_p99_ms=ITL_SLO_S * 1000, chat_ttft_p99_ms=TTFT_SLO_S * 1000))
    for i, name in enumerate(REPLICAS):
        # decided ten minutes ago and not since: the controller is stale
        obs = Observation(t=now - 600, replica=name, chat_itl_p99_s=0.3, chat_ttft_p99_s=3.0)
        decision = Decision(2 + i, 512, reason="grow", batch_step_target_ms=50.0)
        gate.record(obs, decision, 1)
        gate.record_steps({"replica": name, "batch_tokens_per_step": 256.0})

    tonight = RunMetrics("deploy-rules-test")
    tonight.night_started(deadline_ts=now - 60)
    tonight.remaining.set(10)
    tonight.document_done("done", 2048)
    tonight.document_done("failed", 0)
    last_night = RunMetrics("deploy-rules-yesterday")
    last_night.night_ended("success", now - 2 * 86400)
    last_night.night_ended("failed", now - 86400)

    chat = {name: (Buckets(GAP_BOUNDS_S), Buckets(TTFT_BOUNDS_S)) for name in REPLICAS}

    vllm = CollectorRegistry()
    Gauge("vllm:kv_cache_usage_perc", "KV", ["model_name"], registry=vllm).labels(MODEL).set(0.7)
    preemptions = Counter("vllm:num_preemptions", "P", ["model_name"], registry=vllm)
    for name, value in (("vllm:num_requests_running", 8), ("vllm:num_requests_waiting", 3)):
        Gauge(name, name, ["model_name"], registry=vllm).labels(MODEL).set(value)

    stop = threading.Event()

    def churn() -> None:
        # r0 is slow for chat (over both SLOs), r1 fast; batch tokens and preemptions grow.
        while not stop.wait(0.05):
            for name, (itl, ttft) in chat.items():
                slow = name == REPLICAS[0]
                itl.observe(0.3 if slow else 0.01)
                ttft.observe(3.0 if slow else 0.1)
                gate.record_status(
                    name, {"chat_itl_seconds": itl.to_dict(), "chat_ttft_seconds": ttft.to_dict()}
                )
            tonight.tokens.inc(100)
            preemptions.labels(MODEL).inc()

    thread = threading.Thread(target=churn, name="deploy-rules-churn", daemon=True)
    registries = {
        "gate": gate.registry,
        "tonight": tonight.registry,
        "last_night": last_night.registry,
    }
    servers = []
    try:
        thread.start()
        for registry in registries.values():
            server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
            servers.append(server)
        servers.append(classic_text_server(vllm))
        registries["vllm"] = vllm
        yield {
            job: [f"127.0.0.1:{server.server_port}"]
            for job, server in zip(registries, servers, strict=True)
        }
    finally:
        stop.set()
        thread.join(timeout=5.0)
        for server in servers:
            server.shutdown()
            server.server_close()


def classic_text_server(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve `registry` in the classic text format whatever the scraper asks for.

    prometheus_client 0.26, asked for OpenMetrics without an `escaping` parameter (as Prometheus
    2.x asks), writes `vllm:kv_cache_usage_perc` samples as `vllm_kv_cache_usage_perc`
    (prometheus/client_python#1177). vLLM's names keep their colons in the classic format, as
    they do for a Prometheus that negotiates UTF-8 names; deploy/README.md says how to get them
    from vLLM under Prometheus 2.x."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="vllm-stand-in", daemon=True).start()
    return server


def wait_until_ready(url: str, targets: int) -> None:
    """Until all `targets` are up, the chat p99s have a window and every alert is at least pending."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    state = None
    with httpx.Client(base_url=url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            up = http.get("/api/v1/query", params={"query": "up == 1"}).json()["data"]["result"]
            p99 = http.get(
                "/api/v1/query", params={"query": "nightshift:chat_itl_seconds:p99_1m > 0"}
            ).json()["data"]["result"]
            active = {a["labels"]["alertname"] for a in alerts(http)}
            state = (len(up), len(p99), sorted(active))
            if len(up) == targets and len(p99) == len(REPLICAS) and active == ALERTS:
                return
            time.sleep(0.2)
    raise AssertionError(f"(targets up, p99 series, active alerts) still {state}")


def alerts(http: httpx.Client) -> list[dict]:
    response = http.get("/api/v1/alerts").json()
    assert response["status"] == "success", response
    return response["data"]["alerts"]


def promtool(*args: str) -> str:
    """Run promtool from the rules' folder (the unit tests name the rule file relative to it)."""
    done = subprocess.run(
        ["promtool", *args],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{out}"
    return out
