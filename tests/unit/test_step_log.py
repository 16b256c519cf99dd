"""The engine's step log: the samples format, and a bound on its size."""

from __future__ import annotations

from scheduler.step import PrefillChunk
from serving.engine_site.step_log import StepLog
from serving.step_samples import read_samples


def test_steps_are_read_back_as_samples_exactly(tmp_path) -> None:
    log = StepLog(tmp_path / "steps.jsonl")
    log.record([(96, 16384), (300, 0)], 4, 2400, 0.0625)
    log.record([], 2, 100, 0.004)
    first, second = read_samples(tmp_path / "steps.jsonl")
    assert first.batch.prefills == (PrefillChunk(96, 16384), PrefillChunk(300, 0))
    assert (first.batch.decode_seqs, first.batch.decode_context_tokens) == (4, 2400)
    assert first.seconds == 0.0625
    assert second.batch.prefills == () and second.batch.decode_seqs == 2


def test_the_log_stops_at_its_bound_and_later_steps_are_ignored(tmp_path) -> None:
    log = StepLog(tmp_path / "steps.jsonl", max_lines=3)
    for i in range(10):
        log.record([], 1, i, 0.001)
    assert len(read_samples(tmp_path / "steps.jsonl")) == 3
    log.close()
