"""The summarization job on real Ray against real replicas: nothing lost, nothing done twice."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.config import PipelineConfig
from pipelines.corpus_maker import CorpusSpec, make_corpus
from pipelines.job import JobSpec, _init_ray, run_job
from pipelines.run_store import RunMismatch
from serving.engine_config import load_engine_config
from serving.launcher import ReplicaSet
from serving.tokenizer import tokenizer_for
from tests.replicas import TINY, free_port_block
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

SMALL_OUTPUTS = PipelineConfig(
    max_model_len=4096,
    section_summary_tokens=16,
    final_summary_tokens=24,
    ignore_eos=True,
    overlap_tokens=16,
)


def write_corpus(path: Path, docs: int, lo: int, hi: int, seed: int) -> list[str]:
    tok = tokenizer_for(load_engine_config(TINY))
    made = make_corpus(CorpusSpec(docs=docs, min_tokens=lo, max_tokens=hi, seed=seed), tok)
    rows = [{"doc_id": d.doc_id, "text": d.text} for d in made]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return [d.doc_id for d in made]


def spec_for(corpus: Path, replicas, results: Path, run_id: str, **kw) -> JobSpec:
    return JobSpec(
        corpus=str(corpus),
        engine_config=str(TINY),
        replicas=[(r.name, r.base_url) for r in replicas],
        run_id=run_id,
        results=str(results),
        pipeline=SMALL_OUTPUTS,
        policy="static",
        static_caps=(2, 400),
        show_progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    replicas = ReplicaSet(tmp_path_factory.mktemp("engines"))
    config = load_engine_config(TINY)
    with replicas.running(config, str(TINY), free_port_block(2), count=2) as started:
        yield started


@pytest.fixture(scope="module", autouse=True)
def ray_from_the_main_thread():
    """Start Ray here, not in the job thread of the kill test: Ray's GCS and raylet die with the
    thread that started them (Linux PDEATHSIG is per thread), and the next test would wait a minute
    for a GCS that is gone, then exit. A flow or CLI starts Ray from its main thread."""
    _init_ray()


def test_replica_killed_mid_run_loses_no_document(two_replicas, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.parquet"
    doc_ids = write_corpus(corpus, docs=14, lo=800, hi=2400, seed=3)
    spec = spec_for(corpus, two_replicas, tmp_path / "results", "kill-one")
    victim = two_replicas[1]
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", run_job(spec)))
    worker.start()
    run_dir = tmp_path / "results" / "runs" / "kill-one"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _served_by(run_dir, victim.name):
        time.sleep(0.2)
    assert _served_by(run_dir, victim.name), "the victim never served a request"
    os.killpg(victim.pid, signal.SIGKILL)
    worker.join(timeout=600)
    assert not worker.is_alive()
    summaries = read_table(run_dir, "summaries").column("doc_id").to_pylist()
    assert sorted(summaries) == sorted(doc_ids)  # every document exactly once
    docs = read_table(run_dir, "documents")
    assert set(docs.column("status").to_pylist()) == {"done"}
    served_after_kill = read_table(run_dir, "requests").to_pylist()
    assert any(r["replica"] == two_replicas[0].name for r in served_after_kill)
    assert result["r"].docs_done == len(doc_ids)
    # each of the 2 actors works on several documents at once (docs_per_actor), not one
    assert _most_documents_at_once(served_after_kill) > SMALL_OUTPUTS.actors


def _most_documents_at_once(requests: list[dict]) -> int:
    spans: dict[str, list[float]] = {}
    for r in requests:
        span = spans.setdefault(r["doc_id"], [r["t_submit"], r["t_end"] or r["t_submit"]])
        span[0] = min(span[0], r["t_submit"])
        span[1] = max(span[1], r["t_end"] or r["t_submit"])
    edges = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    active = peak = 0
    for _, step in edges:
        active += step
        peak = max(peak, active)
    return peak


def _served_by(run_dir: Path, replica: str) -> bool:
    if not (run_dir / "requests").is_dir():
        return False
    return replica in read_table(run_dir, "requests").column("replica").to_pylist()


def test_rerun_resumes_without_redoing_and_refuses_another_corpus(
    two_replicas, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.parquet"
    write_corpus(corpus, docs=4, lo=300, hi=900, seed=5)
    results = tmp_path / "results"
    first = run_job(spec_for(corpus, two_replicas[:1], results, "again"))
    assert first.docs_done == 4
    requests_before = read_table(results / "runs" / "again", "requests").num_rows
    second = run_job(spec_for(corpus, two_replicas[:1], results, "again"))
    assert second.docs_already_done == 4 and second.docs_done == 0
    run_dir = results / "runs" / "again"
    assert read_table(run_dir, "requests").num_rows == requests_before
    assert read_table(run_dir, "summaries").num_rows == 4
    assert read_table(run_dir, "documents").num_rows == 4

    other = tmp_path / "other.parquet"
    write_corpus(other, docs=2, lo=300, hi=400, seed=9)
    with pytest.raises(RunMismatch, match="different corpus"):
        run_job(spec_for(other, two_replicas[:1], results, "again"))


def test_a_night_starts_after_giving_back_what_the_work_before_left_in_a_cycle(
    two_replicas, tmp_path: Path
) -> None:
    """A finished night's actors can outlive it, reachable only from reference cycles, holding
    their CPUs until the driver's next full collection, seconds or minutes away. Here an actor
    holding every CPU of the cluster stands in for them: it must be gone before the night starts
    summarizing."""
    import gc
    import weakref

    import ray

    @ray.remote
    class Hog:
        def ready(self) -> bool:
            return True

    class Left:
        pass

    corpus = tmp_path / "corpus.parquet"
    write_corpus(corpus, docs=2, lo=300, hi=400, seed=11)
    at_start: dict = {}

    def summarizing() -> None:
        at_start["cycle"] = left_ref() is not None

    spec = spec_for(corpus, two_replicas[:1], tmp_path / "results", "after-leftovers")
    spec = replace(spec, on_summarize_start=summarizing)
    gc.disable()  # the collector must not happen to run first
    try:
        left = Left()
        left.hog = Hog.options(num_cpus=ray.cluster_resources()["CPU"]).remote()
        assert ray.get(left.hog.ready.remote())
        left.me = left
        left_ref = weakref.ref(left)
        del left
        assert not ray.available_resources().get("CPU"), "the cycle holds every CPU"
        result = run_job(spec)
    finally:
        gc.enable()
    assert at_start == {"cycle": False}, "the night started with the hog's CPUs held"
    assert result.docs_done == 2
