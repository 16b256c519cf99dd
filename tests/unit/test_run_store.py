import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.run_store import RunMismatch, RunStore, check_resumable
from warehouse.run_files import RunMeta, read_table


def corpus(path: Path, ids: list[str]) -> Path:
    pq.write_table(pa.Table.from_pylist([{"doc_id": i, "text": f"text {i}"} for i in ids]), path)
    return path


def outcome(doc_id: str, status: str = "done") -> dict:
    request = {
        "run_id": "r",
        "request_id": f"q-{doc_id}",
        "class": "batch",
        "stage": "whole",
        "replica": "a",
        "doc_id": doc_id,
        "prompt_tokens": 10,
        "output_tokens": 2,
        "t_submit": 0.5,
        "status": "ok",
    }
    return {
        "doc_id": doc_id,
        "status": status,
        "reason": None if status == "done" else "x",
        "summary": "s",
        "summary_tokens": 2,
        "sections": 1,
        "prompt_tokens": 10,
        "batch_tokens": 12,
        "replicas": json.dumps(["a"]),
        "requests": json.dumps([request]),
        "gaps": json.dumps([{"request_id": f"q-{doc_id}", "idx": 0, "gap_s": 0.01, "t": 1.0}]),
        "t_done": 1.0,
    }


def test_outcomes_are_appended_and_resume_skips_finished(tmp_path: Path) -> None:
    c = corpus(tmp_path / "c.parquet", ["a", "b", "c"])
    store = RunStore(tmp_path, "r")
    meta = store.begin(RunMeta(run_id="r", corpus_path=str(c)))
    store.write_outcomes([outcome("a"), outcome("b", "failed"), outcome("c", "stopped")])
    assert store.finished_doc_ids() == {"a"}
    store.write_outcomes([outcome("b")])  # the rerun's attempt succeeds
    store.finish(meta)
    docs = read_table(store.dir, "documents").to_pylist()
    assert sorted((d["doc_id"], d["status"]) for d in docs) == [("a", "done"), ("b", "done")]
    assert read_table(store.dir, "requests").num_rows == 4  # every attempt's work is kept
    assert read_table(store.dir, "token_gaps").num_rows == 4
    assert not (store.dir / "documents").exists()  # parts compacted away


def test_duplicate_doc_id_row_survives_compaction(tmp_path: Path) -> None:
    c = corpus(tmp_path / "c.parquet", ["a"])
    store = RunStore(tmp_path, "r")
    meta = store.begin(RunMeta(run_id="r", corpus_path=str(c)))
    store.write_rejections(
        [
            {
                "doc_id": "a",
                "status": "skipped",
                "reason": "duplicate doc_id",
                "prompt_tokens": 3,
                "sections": 0,
                "summary_tokens": 0,
                "t_done": 0.0,
            }
        ]
    )
    store.write_outcomes([outcome("a")])
    store.finish(meta)
    assert sorted(d["status"] for d in read_table(store.dir, "documents").to_pylist()) == [
        "done",
        "skipped",
    ]


def test_resume_with_another_corpus_is_refused(tmp_path: Path) -> None:
    first = corpus(tmp_path / "one.parquet", ["a"])
    other = corpus(tmp_path / "two.parquet", ["b"])
    RunStore(tmp_path, "r").begin(RunMeta(run_id="r", corpus_path=str(first)))
    check_resumable(tmp_path, "r", str(first))  # the same corpus resumes
    with pytest.raises(RunMismatch, match="different corpus"):
        check_resumable(tmp_path, "r", str(other))
    with pytest.raises(RunMismatch, match="different corpus"):
        RunStore(tmp_path, "r").begin(RunMeta(run_id="r", corpus_path=str(other)))
