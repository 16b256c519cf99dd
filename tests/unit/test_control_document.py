"""The control document: every bad field named; the plug-in's channel keeps the last good one."""

from __future__ import annotations

import json
import os

import pytest

from scheduler import control_document
from scheduler.control_document import ControlDocumentError
from scheduler.latency_model import LatencyModel
from serving.engine_control import decision_document
from serving.engine_site.control_channel import ControlChannel

MODEL = LatencyModel(s_per_token=1e-5, s_weight_read=1e-3)


def doc(**over) -> dict:
    raw = json.loads(decision_document(5, 40.0, MODEL, 60, now=1000.0).to_json())
    raw.update(over)
    return raw


def test_round_trip():
    parsed = control_document.parse(json.dumps(doc()))
    assert parsed.seq == 5 and parsed.batch_step_target_ms == 40.0
    assert parsed.idle_step_target_ms is None
    assert "idle_step_target_ms" not in json.loads(parsed.to_json())
    idle = control_document.parse(json.dumps({**doc(), "idle_step_target_ms": 250}))
    assert control_document.parse(idle.to_json()).idle_step_target_ms == 250.0
    assert parsed.mean_step_target_ms is None and "mean_step_target_ms" not in parsed.to_json()
    meant = decision_document(5, 40.0, MODEL, 60, now=1000.0, mean_target_ms=16.0)
    assert control_document.parse(meant.to_json()).mean_step_target_ms == 16.0
    assert parsed.chat_cache_horizon_s is None and "chat_cache_horizon_s" not in parsed.to_json()
    kept = control_document.parse(json.dumps({**doc(), "chat_cache_horizon_s": 60}))
    assert control_document.parse(kept.to_json()).chat_cache_horizon_s == 60.0
    assert parsed.latency_model.coefficients() == MODEL.coefficients()
    assert parsed.expired(1060.0) and not parsed.expired(1059.9)
    assert parsed.tail_scale and "tail_scale" not in parsed.to_json()
    unscaled = decision_document(5, 40.0, MODEL, 60, now=1000.0, tail_scale=False)
    assert control_document.parse(unscaled.to_json()).tail_scale is False


@pytest.mark.parametrize(
    "over,named",
    [
        ({"budget": 3}, "unknown key 'budget'"),
        ({"batch_step_target_ms": "fast"}, "batch_step_target_ms must be float"),
        ({"batch_step_target_ms": -1}, "batch_step_target_ms must be a finite number >= 0"),
        ({"seq": 1.5}, "seq must be int"),
        ({"pause": 1}, "pause must be bool"),
        ({"latency_model": {"s_per_token": -1.0}}, "latency_model"),
        ({"latency_model": {"warp": 1.0}}, "unknown coefficient 'warp'"),
        ({"format": "other/9"}, "format 'other/9'"),
        ({"idle_step_target_ms": -5}, "idle_step_target_ms must be a finite number >= 0"),
        ({"idle_step_target_ms": None}, "idle_step_target_ms must be float"),
        ({"mean_step_target_ms": float("nan")}, "mean_step_target_ms must be a finite number"),
        ({"chat_cache_horizon_s": -1}, "chat_cache_horizon_s must be a finite number >= 0"),
        ({"tail_scale": "no"}, "tail_scale must be bool"),
    ],
)
def test_bad_fields_are_named(over, named):
    with pytest.raises(ControlDocumentError, match=named.replace("(", r"\(")):
        control_document.parse(json.dumps(doc(**over)))


def test_missing_key_garbage_and_huge_documents_are_rejected():
    raw = doc()
    del raw["expires_at"]
    with pytest.raises(ControlDocumentError, match="missing key 'expires_at'"):
        control_document.from_dict(raw)
    with pytest.raises(ControlDocumentError, match="not JSON"):
        control_document.parse(b"\xff\xfe")
    with pytest.raises(ControlDocumentError, match="bytes, more than"):
        control_document.parse(" " * (control_document.MAX_BYTES + 1))
    with pytest.raises(ControlDocumentError, match="nested too deep"):
        control_document.parse("[" * 10_000)  # fits MAX_BYTES; the decoder ran out of stack


class Clock:
    def __init__(self) -> None:
        self.wall, self.mono = 1000.0, 0.0

    def tick(self, s: float) -> None:
        self.wall += s
        self.mono += s


def channel(tmp_path, clock, logs):
    return ControlChannel(tmp_path / "control.json", logs.append, 0.025,
                          lambda: clock.wall, lambda: clock.mono)  # fmt: skip


def write(path, raw) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    os.replace(tmp, path)


def test_channel_states_from_inert_to_lost(tmp_path):
    clock, logs = Clock(), []
    ch = channel(tmp_path, clock, logs)
    path = tmp_path / "control.json"
    assert ch.directive() is None, "no document ever: inert"
    write(path, doc())
    clock.tick(0.03)
    assert ch.directive().state == "active"
    write(path, "garbage")
    clock.tick(0.03)
    d = ch.directive()
    assert d.state == "active" and d.seq == 5 and ch.rejected == 1
    write(path, doc(seq=4))
    clock.tick(0.03)
    assert ch.directive().seq == 5 and "stale seq 4" in ch.last_rejection
    write(path, doc(seq=6, pause=True))
    clock.tick(0.03)
    assert ch.directive().state == "paused"
    clock.tick(60)
    assert ch.directive().state == "expired"
    write(path, doc(seq=7, expires_at=clock.wall + 60))
    clock.tick(0.03)
    assert ch.directive().state == "active"
    path.unlink()
    clock.tick(0.03)
    assert ch.directive().state == "lost"
    assert any("paused" in line for line in logs)


def test_channel_reads_the_file_at_most_once_per_poll_interval(tmp_path):
    clock, logs = Clock(), []
    ch = channel(tmp_path, clock, logs)
    write(tmp_path / "control.json", doc())
    ch.directive()
    write(tmp_path / "control.json", doc(seq=9))
    clock.tick(0.01)
    assert ch.directive().seq == 5
    clock.tick(0.02)
    assert ch.directive().seq == 9


def test_channel_rejects_expired_huge_and_unreadable_kinds_and_keeps_the_last(tmp_path):
    clock, logs = Clock(), []
    ch = channel(tmp_path, clock, logs)
    path = tmp_path / "control.json"
    write(path, doc(seq=5, expires_at=clock.wall + 600))
    clock.tick(0.03)
    assert ch.directive().state == "active"
    for seq, (content, reason) in enumerate(
        [
            (doc(seq=6, expires_at=clock.wall - 30), "expired on arrival"),
            ("[" * 10_000, "not JSON: nested too deep"),
            (" " * 10_000_000, "document is 10000000 bytes"),
        ],
        start=1,
    ):
        write(path, content)
        clock.tick(0.03)
        d = ch.directive()
        assert (d.state, d.seq, ch.rejected) == ("active", 5, seq)
        assert reason in ch.last_rejection
    path.unlink()
    os.mkfifo(path)  # open() of a FIFO would wait for a writer forever
    clock.tick(0.03)
    assert ch.directive().seq == 5 and "not a regular file" in ch.last_rejection


def test_an_expired_first_document_pauses_batch_instead_of_leaving_stock_scheduling(tmp_path):
    clock, logs = Clock(), []
    ch = channel(tmp_path, clock, logs)
    write(tmp_path / "control.json", doc(seq=5, expires_at=clock.wall - 1))
    clock.tick(0.03)
    assert ch.directive().state == "expired" and ch.rejected == 1
