"""Chat sessions and the batch dispatcher (simulator/workloads.py, dispatcher.py); the trace
reader has its own tests (test_sim_trace.py)."""

from __future__ import annotations

import pytest

from scheduler.admission import Decision
from simulator.config import BatchWorkload, ChatWorkload
from simulator.dispatcher import BatchDispatcher
from simulator.workloads import ChatSessions


def test_turns_resend_system_prompt_context_and_the_whole_history():
    cfg = ChatWorkload(rate=1.0, system_prompt_tokens=600, context_tokens=400)
    sessions = ChatSessions(cfg, 1)
    s = sessions.new_session()
    first = sessions.next_turn(s, 0.0)
    first.output_tokens = first.max_output
    sessions.record_answer(s, first)
    second = sessions.next_turn(s, 10.0)
    keys = [seg.key for seg in second.segments]
    assert keys[:2] == [("system",), ("context", s.sid, 0)]
    assert keys[2:4] == [first.segments[-1].key, first.output_key]
    assert second.segments[3].length == first.max_output
    assert (
        second.prompt_tokens == first.prompt_tokens + first.max_output + second.segments[-1].length
    )


def test_retrieval_per_turn_changes_the_context_every_turn():
    cfg = ChatWorkload(rate=1.0, retrieval_per_turn=True)
    sessions = ChatSessions(cfg, 1)
    s = sessions.new_session()
    a, b = sessions.next_turn(s, 0.0), sessions.next_turn(s, 1.0)
    assert a.segments[1].key != b.segments[1].key


def test_session_lengths_and_arrivals_have_the_configured_means():
    cfg = ChatWorkload(rate=6.0, turns_mean=3.0)
    sessions = ChatSessions(cfg, 7)
    turns = [sessions.new_session().turns_left for _ in range(4000)]
    gaps = [sessions.session_gap_s() for _ in range(4000)]
    assert sum(turns) / len(turns) == pytest.approx(3.0, rel=0.05)
    assert sum(gaps) / len(gaps) == pytest.approx(3.0 / 6.0, rel=0.05)


def test_map_mode_cuts_sections_of_the_decided_size_within_the_seats():
    disp = BatchDispatcher(BatchWorkload(docs=1, doc_tokens=1000, mode="map"), ["r0"])
    disp.add_backlog(1, 1000)
    assert disp.admit("r0", 0.0) == []  # no decision yet: batch waits
    disp.set_decision("r0", Decision(batch_seats=2, chunk_tokens=300))
    first = disp.admit("r0", 0.0)
    assert [r.segments[-1].length for r in first] == [300, 300]
    assert {r.stage for r in first} == {"map"}
    disp.finished(first[0], 1.0, ok=True)
    disp.set_decision("r0", Decision(batch_seats=2, chunk_tokens=500))
    assert [r.segments[-1].length for r in disp.admit("r0", 1.0)] == [400]
    assert disp.docs_done == 0


def test_the_prefill_budget_admits_sections_as_the_prefill_ahead_drains():
    cfg = BatchWorkload(docs=1, doc_tokens=4000, mode="map")
    disp = BatchDispatcher(cfg, ["r0"])
    disp.add_backlog(1, 4000)
    section = 500 + cfg.instruction_tokens
    disp.set_decision("r0", Decision(8, 500, prefill_budget_tokens=2 * section))
    a, b = disp.admit("r0", 0.0)  # two fit the budget; six seats stay free
    assert disp.admit("r0", 0.0) == []
    a.num_computed = a.prompt_tokens  # a's prefill is done: one more fits
    assert len(disp.admit("r0", 0.1)) == 1
    b.num_computed = b.prompt_tokens // 2
    assert disp.admit("r0", 0.2) == []  # half of b and all of the third are still ahead


def test_a_reduce_over_the_section_summaries_finishes_a_split_document():
    cfg = BatchWorkload(mode="map", section_summary_tokens=96, summary_tokens=192)
    disp = BatchDispatcher(cfg, ["r0"])
    disp.add_backlog(2, 1000)
    disp.set_decision("r0", Decision(batch_seats=2, chunk_tokens=500))
    a, b = disp.admit("r0", 0.0)
    assert (a.max_output, b.max_output) == (96, 96)
    disp.finished(a, 1.0, ok=True)
    disp.finished(b, 2.0, ok=True)
    reduce, section = disp.admit("r0", 2.0)  # the reduce goes ahead of the next document
    assert reduce.stage == "reduce" and reduce.doc_id == a.doc_id
    assert reduce.prompt_tokens == cfg.instruction_tokens + 2 * 96 and reduce.max_output == 192
    assert section.doc_id != a.doc_id
    assert disp.docs_done == 0
    disp.finished(reduce, 3.0, ok=True)
    assert disp.docs_done == 1


def test_a_failed_section_fails_its_document_and_stops_its_cutting():
    disp = BatchDispatcher(BatchWorkload(mode="map"), ["r0"])
    disp.add_backlog(1, 1000)
    disp.set_decision("r0", Decision(batch_seats=1, chunk_tokens=300))
    (first,) = disp.admit("r0", 0.0)
    disp.finished(first, 1.0, ok=False)
    assert disp.admit("r0", 1.0) == []
    assert disp.document_rows("run")[0]["status"] == "failed"


def test_pause_admits_nothing_and_a_document_is_done_with_its_last_section():
    disp = BatchDispatcher(BatchWorkload(mode="map"), ["r0"])
    disp.add_backlog(1, 100)
    disp.set_decision("r0", Decision(batch_seats=5, chunk_tokens=100, pause=True))
    assert disp.admit("r0", 0.0) == []
    disp.set_decision("r0", Decision(batch_seats=5, chunk_tokens=100))
    (only,) = disp.admit("r0", 0.0)
    assert only.stage == "whole"
    disp.finished(only, 2.0, ok=True)
    assert disp.docs_done == 1
    assert disp.document_rows("run")[0]["status"] == "done"


def test_whole_mode_sends_documents_whole_and_caps_their_prefill_chunks():
    disp = BatchDispatcher(BatchWorkload(mode="whole"), ["r0"])
    disp.add_backlog(2, 80_000)
    disp.set_decision("r0", Decision(batch_seats=1, chunk_tokens=512))
    (doc,) = disp.admit("r0", 0.0)
    assert doc.prompt_tokens == 80_000 + 200 and doc.chunk_cap == 512
    disp.set_decision("r0", Decision(batch_seats=1, chunk_tokens=256))
    assert doc.chunk_cap == 256  # in-flight documents follow the latest decision
