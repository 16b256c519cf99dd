"""Two ~80k-token documents summarized whole on a real cpu-long replica, chat streaming beside
them, under the SLO controller: one request per document, the instruction served from the prefix
cache to the second, and no preemption (the KV guard admits a document only whole)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.config import PipelineConfig
from pipelines.corpus_maker import CorpusSpec, make_corpus
from pipelines.job import JobSpec, _init_ray, run_job
from scheduler.slo import SLO
from serving.engine_config import load_engine_config
from serving.metrics import parse_metrics
from serving.tokenizer import tokenizer_for
from tests.integration.small_replica.test_engine_plugin import chat_for
from tests.replicas import fit_of, for_this_cpu, replica_of
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

LONG = for_this_cpu("cpu-long")
FIT = fit_of(LONG)
CHAT_S = 45.0


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    with replica_of(LONG, tmp_path_factory) as started:
        yield started


def preemptions(replica) -> float:
    text = httpx.get(f"{replica.base_url}/metrics", timeout=10).text
    return parse_metrics(text).counter("vllm:num_preemptions")


def test_80k_documents_are_summarized_whole_beside_chat_without_preemption(replica, tmp_path):
    tok = tokenizer_for(load_engine_config(LONG))
    made = make_corpus(CorpusSpec(docs=2, min_tokens=80_000, max_tokens=81_000, seed=19), tok)
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc_id": d.doc_id, "text": d.text} for d in made]),
                   corpus)  # fmt: skip
    spec = JobSpec(
        corpus=str(corpus),
        engine_config=str(LONG),
        replicas=[(replica.name, replica.base_url)],
        run_id="long-whole",
        results=str(tmp_path / "results"),
        # One document at a time, so the second finds the instruction the first left in the cache.
        pipeline=PipelineConfig(
            mode="auto",
            max_model_len=98_304,
            final_summary_tokens=16,
            ignore_eos=True,
            actors=1,
            docs_per_actor=1,
        ),  # fmt: skip
        slo=SLO(chat_itl_p99_ms=60.0, chat_ttft_p99_ms=2000.0, window_s=5.0),
        policy="slo",
        latency_model=str(FIT),
        interval_s=1.0,
        show_progress=False,
    )
    _init_ray()
    before = preemptions(replica)
    chats: list[float] = []
    chat = threading.Thread(target=lambda: chats.extend(asyncio.run(chat_for(replica, CHAT_S, 5))))
    chat.start()
    result = run_job(spec)
    chat.join(timeout=CHAT_S + 120)

    assert result.docs_done == 2 and result.docs_failed == 0
    requests = sorted(
        read_table(tmp_path / "results" / "runs" / "long-whole", "requests").to_pylist(),
        key=lambda r: r["t_submit"],
    )
    report = (f"{result.docs_done} done in {result.seconds:.0f} s; prompt tokens "
              f"{[r['prompt_tokens'] for r in requests]}, cached {[r['cached_tokens'] for r in requests]}, "
              f"{len(chats)} chats beside")  # fmt: skip
    print(report)
    assert len(requests) == 2, "each document is one request: summarized whole"
    assert all(r["prompt_tokens"] >= 80_000 for r in requests), requests
    assert requests[1]["cached_tokens"] > 0, "the instruction comes from the prefix cache"
    assert preemptions(replica) == before
    assert chats, "chat was served beside the documents"
