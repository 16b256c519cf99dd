"""KV pressure: documents on a replica whose KV pool holds eight of their prompts but only six of
their prompts with their summaries, chat bursting beside.

vLLM admits a request once its whole prompt fits the free blocks (`scheduler_reserve_full_isl`),
not its output: eight documents sent at once with no guard (the plug-in inert, stock vLLM) are all
admitted, their summaries outgrow the pool and the engine preempts. That is the pressure. Then
`nightshift run --policy slo` over sixteen of them with three chat users beside: the controller's KV
guard admits a document only while its prompt and summary fit under the high-water mark beside
everything committed, so the engine preempts nothing, every document is summarized whole and every
chat is answered."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from pipelines.config import PipelineConfig
from scheduler.budget_controller import BudgetControllerConfig
from serving.metrics import parse_metrics
from serving.sensors import kv_capacity_tokens
from tests.faults.chat_user import ChatUser
from tests.faults.one_replica.night import corpus, start_run
from tests.faults.small_pool.conftest import BLOCKS
from warehouse.run_files import read_table

pytestmark = pytest.mark.engine

WORDS = 250
"""Words per document: ~900 prompt tokens (cpu-tiny's tokenizer makes ~3.6 of these words), 29
blocks: eight prompts fit the pool (232 blocks), eight prompts and summaries (280) do not."""
DOCS = [f"doc-{i:02d}" for i in range(16)]
UNGUARDED = 8


def metrics(replica):
    return parse_metrics(httpx.get(f"{replica.base_url}/metrics", timeout=10).text)


def preemptions(replica) -> float:
    return metrics(replica).counter("vllm:num_preemptions")


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """Most of the (start, end) spans open at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    open_, most = 0, 0
    for _, step in edges:
        open_ += step
        most = max(most, open_)
    return most


def test_the_kv_guard_admits_what_fits_and_the_engine_preempts_nothing(
    replica, tmp_path: Path
) -> None:
    capacity = kv_capacity_tokens(metrics(replica))
    assert capacity == BLOCKS * 32  # the small pool is in force
    texts = pq.read_table(corpus(tmp_path / "c.parquet", DOCS, words=WORDS)).column("text")
    summary_tokens = PipelineConfig().final_summary_tokens

    # No guard: eight documents at once are all admitted and outgrow the pool.
    before = preemptions(replica)
    body = {"model": replica.served_model, "max_tokens": summary_tokens, "ignore_eos": True,
            "priority": 10}  # fmt: skip
    with httpx.Client(timeout=300) as http, ThreadPoolExecutor(UNGUARDED) as pool:
        sent = [
            pool.submit(
                http.post, f"{replica.base_url}/v1/completions", json={**body, "prompt": str(t)}
            )  # fmt: skip
            for t in texts.to_pylist()[:UNGUARDED]
        ]
        answers = [s.result() for s in sent]
    assert all(a.status_code == 200 for a in answers)
    prompt_tokens = max(a.json()["usage"]["prompt_tokens"] for a in answers)
    unguarded = preemptions(replica) - before
    assert unguarded > 0, "eight documents fit the pool: the case exerts no pressure"

    # The guard: a night of sixteen with chat bursting beside.
    high_water = BudgetControllerConfig().kv_high_water
    fit = math.floor(high_water * capacity / (prompt_tokens + summary_tokens))
    assert fit < UNGUARDED
    chats = [ChatUser(replica, prompt=" ".join(["a chat about rent"] * 15)) for _ in range(3)]
    before = preemptions(replica)
    for c in chats:
        c.start()
    run = start_run(tmp_path, replica, "kv-pressure", "--policy", "slo")
    try:
        out, _ = run.communicate(timeout=300)
    finally:
        run.kill()
        for c in chats:
            c.stop.set()
        for c in chats:
            c.join(timeout=60)
    guarded = preemptions(replica) - before

    assert run.returncode == 0, out[-4000:]
    run_dir = tmp_path / "results" / "runs" / "kv-pressure"
    documents = read_table(run_dir, "documents").to_pylist()
    assert sorted(d["doc_id"] for d in documents if d["status"] == "done") == DOCS, documents
    assert all(d["sections"] == 1 for d in documents)  # whole, as long documents are
    assert guarded == 0
    requests = [r for r in read_table(run_dir, "requests").to_pylist() if r["class"] == "batch"]
    at_once = most_at_once([(r["t_submit"], r["t_end"]) for r in requests])
    assert at_once <= fit
    done = [status for c in chats for _, _, status in c.done]
    assert done and all(status == 200 for status in done)
    print(
        f"KV pool {capacity} tokens, documents of {prompt_tokens}+{summary_tokens}: unguarded, "
        f"{UNGUARDED} at once -> {unguarded:.0f} preemptions; guarded night of {len(DOCS)} -> {guarded:.0f} "
        f"preemptions, at most {at_once} documents at once (fit {fit}), {len(done)} chats all 200"
    )
