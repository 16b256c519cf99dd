"""The metrics source gone mid-night: `nightshift run --policy slo --prometheus-url` on the keyed
cpu-tiny replica, and the real Prometheus it reads stopped (SIGSTOP: it takes connections and
answers nothing) for longer than the controller's `stale_after_s`, while chat streams beside the
night. Within one decision interval and one sensor timeout the Gate decides `stale` and pauses
batch, the plug-in takes the pause and prefills no batch token until Prometheus answers again,
chat is served throughout, batch resumes (a cold start) once it answers, and no document fails.
The night starts the replica at the slack mark an earlier controlled night on it left."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from bench.processes import descendants
from scheduler.budget_controller import BudgetControllerConfig
from serving.engine_config import load_engine_config
from serving.engine_site.control_files import STATUS_FILE
from tests.faults.chat_user import ChatUser
from tests.faults.one_replica.conftest import KEY
from tests.faults.one_replica.night import corpus, start_run, summaries_so_far
from tests.integration.prometheus_server import prometheus_server
from tests.replicas import TINY
from warehouse.run_files import RunMeta, read_table, run_dir, write_meta, write_table

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]

DOCS = [f"doc-{i:03d}" for i in range(120)]
"""Enough for the night to outlast the outage: the controller opens 8 seats at its cold start.
48 once sufficed; since the night reads its outcomes by block reference, 48 have finished within
3 s of the first summary, before the outage began to count."""
INTERVAL_S = 2.0
"""The Gate's decision interval (`JobSpec.interval_s`, the run's default)."""
SENSOR_TIMEOUT_S = 2.0
"""How long the Gate waits for an observation before it counts the sensor as failed."""
OUTAGE_S = BudgetControllerConfig().stale_after_s + 5
"""Past `stale_after_s`, so that the answer after it is a cold start, not a resumed target."""
EARLIER_MARK = 0.7
"""The slack mark an earlier night left the replica at (the prior is 0.8)."""


def an_earlier_night(results: Path, replica) -> None:
    """The run folder a controlled night on this replica left: its last decision's slack mark."""
    directory = run_dir(results, "earlier-night")
    directory.mkdir(parents=True)
    write_meta(directory, RunMeta("earlier-night", load_engine_config(TINY).name, "slo",
                                  started=time.time() - 86_400))  # fmt: skip
    url = urlparse(replica.base_url)
    rows = [{"t": time.time() - 80_000, "replica": f"{url.hostname}:{url.port}",
             "batch_seats": 4, "chunk_tokens": 0, "slack_mark": EARLIER_MARK}]  # fmt: skip
    write_table(directory, "decisions", rows, run_id="earlier-night", part="1")


def listens_at(pid: int, url: str) -> bool:
    """Whether process `pid` was started to listen at `url` (Prometheus's `--web.listen-address`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"--web.listen-address={url.split('://')[1]}".encode() in argv


def plugin_status(replica) -> dict:
    return json.loads((replica.control_dir / STATUS_FILE).read_text())


def test_batch_pauses_while_metrics_are_gone_chat_goes_on_and_batch_resumes(
    replica, tmp_path: Path
) -> None:
    corpus(tmp_path / "c.parquet", DOCS)
    an_earlier_night(tmp_path / "results", replica)
    night = tmp_path / "results" / "runs" / "metrics-gone"
    jobs = {"vllm": [f"{replica.host}:{replica.port}"]}
    with prometheus_server(tmp_path / "prometheus", jobs) as prom_url:
        (prometheus,) = (p for p in descendants(os.getpid()) if listens_at(p, prom_url))
        chat = ChatUser(replica, KEY)
        chat.start()
        run = start_run(tmp_path, replica, "metrics-gone", "--policy", "slo",
                        "--prometheus-url", prom_url)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not summaries_so_far(night):
                assert run.poll() is None, run.stdout.read()[-3000:]
                time.sleep(0.2)
            os.kill(prometheus, signal.SIGSTOP)
            stopped_at = time.time()
            time.sleep(INTERVAL_S + SENSOR_TIMEOUT_S + 2)
            held = plugin_status(replica)
            time.sleep(OUTAGE_S - (time.time() - stopped_at))
            before_resume = plugin_status(replica)
        finally:
            os.kill(prometheus, signal.SIGCONT)
        resumed_at = time.time()
        out, _ = run.communicate(timeout=400)
        chat.stop.set()
        chat.join(timeout=60)
    end = plugin_status(replica)

    assert run.returncode == 0, out[-4000:]
    documents = read_table(night, "documents").to_pylist()
    assert sorted(d["doc_id"] for d in documents if d["status"] == "done") == DOCS, documents
    assert sorted(read_table(night, "summaries").column("doc_id").to_pylist()) == DOCS

    decisions = sorted(read_table(night, "decisions").to_pylist(), key=lambda d: d["t"])
    during = [d for d in decisions if stopped_at < d["t"] <= resumed_at]
    first_stale = next(d for d in during if d["reason"] == "stale")
    paused_within_s = first_stale["t"] - stopped_at
    assert paused_within_s <= INTERVAL_S + SENSOR_TIMEOUT_S + 1.5, paused_within_s
    late = [d for d in during if d["t"] >= first_stale["t"]]
    assert all(d["reason"] == "stale" and d["pause"] and d["batch_seats"] == 0 for d in late)
    after = [d for d in decisions if d["t"] > resumed_at]
    first_open = next(d for d in after if not d["pause"])
    assert first_open["reason"] == "cold-start"
    first_start = next(d for d in decisions if d["reason"] == "cold-start")
    assert first_start["slack_mark"] == pytest.approx(EARLIER_MARK), "the earlier night's mark"

    assert held["state"] == before_resume["state"] == "paused"
    prefilled = before_resume["totals"]["batch_prefill_tokens"]
    assert prefilled == held["totals"]["batch_prefill_tokens"]  # none while the pause held
    assert before_resume["last_batch_prefill_at"] <= first_stale["t"] + 0.5
    assert end["totals"]["batch_prefill_tokens"] > prefilled  # batch went on after
    finished_after = [d for d in documents if d["t_done"] > resumed_at]
    assert finished_after, "every document finished before the metrics came back"

    assert chat.done and all(status == 200 for _, _, status in chat.done)
    served_during = [c for c in chat.done if stopped_at < c[0] and c[1] < resumed_at]
    assert served_during, "no chat was served while the metrics were gone"
    print(
        f"stale decision {paused_within_s:.1f} s after the stop; {len(late)} stale decisions; "
        f"first open decision {first_open['t'] - resumed_at:.1f} s after Prometheus answered; "
        f"{len(served_during)} chats served in the {OUTAGE_S:.0f} s outage, {len(chat.done)} in "
        f"all; {len(finished_after)} documents finished after it"
    )
