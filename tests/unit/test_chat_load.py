"""The chat load runner against a fake streaming server: records, history, routing, stopping."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from bench.chat_load import ChatLoadSpec, Router, run_chat_load
from bench.chat_results import SentTurn, summarize, write_run
from bench.chat_sessions import ChatShape, TurnPlan
from scheduler.records import RequestRecord
from tests.unit.test_chat_sessions import TEXT, CharTokenizer

SHAPE = ChatShape(
    system_prompt_tokens=200,
    retrieved_chunks=2,
    chunk_tokens=30,
    documents=5,
    chunks_per_document=4,
    question_tokens_min=5,
    question_tokens_max=10,
    output_tokens_median=6,
    output_tokens_sigma=0.3,
    max_tokens=12,
    turns=3,
    fixed_turns=True,
    think_time_s=0.05,
)


class FakeReplica:
    """Streams `max_tokens` chunks, one every `token_s`, and reports half the prompt as cached."""

    def __init__(self, token_s: float = 0.001, stop_after: int | None = None) -> None:
        self.token_s = token_s
        self.bodies: list[tuple[str, dict]] = []
        self.stop_after, self.stop = stop_after, asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append((request.url.host, body))
        if len(self.bodies) == self.stop_after:
            self.stop.set()
        return httpx.Response(200, content=self._stream(body))

    async def _stream(self, body: dict):
        prompt = sum(len(m["content"]) for m in body["messages"])
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.token_s)
            chunk = {"choices": [{"delta": {"content": f"w{i} "}, "token_ids": [i]}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": prompt // 2},
        }
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


async def play(spec: ChatLoadSpec, fake: FakeReplica, replicas=None, stop=None):
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
    replicas = replicas or [("a", "http://a:1")]
    try:
        return await run_chat_load(
            replicas, "m", CharTokenizer(), spec, "unit", stop, text=TEXT, http=http
        )
    finally:
        await http.aclose()


async def test_every_sent_turn_has_a_complete_record_and_sessions_resend_history() -> None:
    fake = FakeReplica()
    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=0.6, seed=1, grace_s=5.0)
    result = await play(spec, fake)
    s = result.summary
    assert s["requests"]["sent"] == len(result.records) == s["requests"]["ok"] > 5
    assert s["requests"]["planned"] == len(spec.plans())
    assert s["window_s"] == 0.6  # arrivals covered the whole duration, however late the last
    for turn in result.turns:
        r = turn.record
        assert r.status == "ok" and r.cls == "chat" and r.stage == "chat" and r.replica == "a"
        assert r.output_tokens == turn.plan.output_tokens and len(r.gaps) == r.output_tokens - 1
        assert r.ttft_s is not None and r.e2e_s >= r.ttft_s
        assert r.request_id == f"chat-{turn.plan.index:06d}-s{turn.plan.session}-t{turn.plan.turn}"
    assert len(result.gaps) == sum(len(r.gaps) for r in result.records)
    assert s["prefix_cache_hit_share"] == pytest.approx(0.5, abs=0.01)
    bodies = [b for _, b in fake.bodies]
    assert all(b["ignore_eos"] and b["priority"] == 0 and b["stream"] for b in bodies)
    later = [t for t in result.turns if t.plan.turn > 0]
    assert later, "some session came back within the run"
    answer = "".join(f"w{i} " for i in range(12))
    for turn in later:
        sent = next(
            b
            for b in bodies
            if b["max_tokens"] == turn.plan.output_tokens
            and len(b["messages"]) == 1 + 2 * turn.history_turns + 1
        )
        assert sent["messages"][2]["role"] == "assistant"
        assert answer.startswith(sent["messages"][2]["content"])


async def test_requests_still_streaming_after_the_grace_period_are_cancelled() -> None:
    fake = FakeReplica(token_s=10.0)  # not even a first token before the grace period ends
    spec = ChatLoadSpec(shape=SHAPE, rate=50.0, duration_s=0.2, seed=2, grace_s=0.3)
    t0 = time.monotonic()
    result = await play(spec, fake)
    assert time.monotonic() - t0 < 5.0
    assert result.records and all(r.status == "cancelled" for r in result.records)
    assert all("still streaming" in r.error and r.e2e_s > 0 for r in result.records)
    req = result.summary["requests"]
    assert req["cancelled"] == len(result.records) and req["ok"] == 0
    assert result.summary["ttft_ms"]["p50"] is None


async def test_an_external_stop_ends_arrivals_early() -> None:
    fake = FakeReplica(stop_after=3)
    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=60.0, seed=3, grace_s=5.0)
    result = await play(spec, fake, stop=fake.stop)
    assert 0 < result.summary["window_s"] < 5.0  # of 60
    assert 3 <= result.summary["requests"]["sent"] < 60
    assert all(r.status == "ok" for r in result.records)


async def test_max_requests_bounds_the_run_and_it_ends_when_they_are_done() -> None:
    fake = FakeReplica()
    spec = ChatLoadSpec(shape=SHAPE, rate=50.0, duration_s=60.0, seed=4, max_requests=7)
    t0 = time.monotonic()
    result = await play(spec, fake)
    assert time.monotonic() - t0 < 5.0
    assert result.summary["requests"]["sent"] + result.summary["requests"]["not_sent"] == 7


async def test_round_robin_alternates_between_replicas() -> None:
    fake = FakeReplica()
    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=0.5, seed=5, routing="round-robin")
    result = await play(spec, fake, replicas=[("a", "http://a:1"), ("b", "http://b:2")])
    hosts = [host for host, _ in fake.bodies]
    assert len(hosts) > 4 and abs(hosts.count("a") - hosts.count("b")) <= 1
    assert {r.replica for r in result.records} == {"a", "b"}


def test_router_policies() -> None:
    least = Router(["a", "b"])
    assert [least.pick(s) for s in range(3)] == ["a", "b", "a"]
    least.release("a")
    least.release("a")
    assert least.pick(9) == "a"
    sticky = Router(["a", "b"], "session")
    first = sticky.pick(1)
    sticky.pick(2)
    assert sticky.pick(1) == first
    with pytest.raises(ValueError, match="no replicas"):
        Router([])


def test_spec_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="routing 'random'"):
        ChatLoadSpec(routing="random")
    with pytest.raises(ValueError, match="duration must be positive"):
        ChatLoadSpec(duration_s=0)


def sent(
    request_id: str, token_times: list[float], prompt: int, cached: int, status: str = "ok"
) -> SentTurn:
    record = RequestRecord(
        "r",
        request_id,
        "chat",
        "chat",
        "a",
        t_submit=0.0,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=len(token_times),
    )
    record.finish(token_times, token_times[-1] if token_times else 1.0)
    record.status = status  # type: ignore[assignment]
    plan = TurnPlan(0, 0.0, int(request_id), 0, (), 0, 1, len(token_times), 0)
    return SentTurn(plan, prompt, 0, record)


def test_summary_weights_itl_by_token_not_by_request() -> None:
    smooth = sent("1", [0.1 + 0.01 * i for i in range(201)], prompt=1000, cached=800)
    stalled = sent("2", [0.2, 1.2], prompt=1000, cached=0)
    s = summarize([smooth, stalled, sent("3", [], 500, 0, "error")], window_s=10.0)
    assert s["itl_ms"]["n"] == 201
    assert s["itl_ms"]["p50"] == pytest.approx(10.0)
    assert s["itl_ms"]["p99"] == pytest.approx(10.0)  # one slow gap in 201 is not the p99
    assert s["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert s["prefix_cache_hit_share"] == pytest.approx(0.4)
    assert s["requests"] | {} == {
        "planned": 3,
        "sent": 3,
        "ok": 2,
        "failed": 1,
        "cancelled": 0,
        "not_sent": 0,
    }
    assert s["achieved_rate"] == pytest.approx(0.3)


async def test_write_run_makes_a_warehouse_run_directory(tmp_path) -> None:
    from warehouse.run_files import read_meta, read_table

    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=0.3, seed=6)
    result = await play(spec, FakeReplica())
    write_run(tmp_path / "unit", result, engine_config="cpu-tiny", hourly_usd=0.1)
    requests = read_table(tmp_path / "unit", "requests", run_id="unit")
    gaps = read_table(tmp_path / "unit", "token_gaps", run_id="unit")
    assert requests.num_rows == len(result.records)
    assert gaps.num_rows == len(result.gaps)
    assert set(requests.column("class").to_pylist()) == {"chat"}
    meta = read_meta(tmp_path / "unit")
    assert (meta.policy, meta.engine_config, meta.replicas) == ("chat-only", "cpu-tiny", 1)
    assert meta.started <= meta.ended


async def test_a_spooled_run_writes_its_records_as_they_end_and_holds_none(tmp_path) -> None:
    from bench.chat_spool import RecordSpool
    from warehouse.run_files import read_table

    directory = tmp_path / "unit"
    (directory / "requests").mkdir(parents=True)
    (directory / "requests" / "chat-00099.parquet").write_bytes(b"an earlier run's part")
    spec = ChatLoadSpec(shape=SHAPE, rate=40.0, duration_s=0.5, seed=7, grace_s=5.0)
    http = httpx.AsyncClient(transport=httpx.MockTransport(FakeReplica().handle))
    spool = RecordSpool(directory, "unit", rows_per_part=2)
    try:
        result = await run_chat_load(
            [("a", "http://a:1")], "m", CharTokenizer(), spec, "unit", text=TEXT, http=http,
            spool=spool,
        )  # fmt: skip
    finally:
        await http.aclose()
    s = result.summary
    assert result.records == [] and result.gaps == [] and result.turns == []
    assert result.spooled == s["requests"]["sent"] > 2
    assert spool.parts == -(-result.spooled // 2)  # the last, partial part flushed at the end
    assert not (directory / "requests" / "chat-00099.parquet").exists()
    write_run(directory, result, engine_config="cpu-tiny")
    requests = read_table(directory, "requests", run_id="unit")
    gaps = read_table(directory, "token_gaps", run_id="unit")
    assert requests.num_rows == result.spooled
    assert len(set(requests.column("request_id").to_pylist())) == result.spooled
    assert gaps.num_rows == s["itl_ms"]["n"]


async def test_a_session_is_forgotten_once_its_last_turn_ends(monkeypatch) -> None:
    import bench.chat_load as chat_load

    runs = []

    class Watched(chat_load._Run):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            runs.append(self)

    monkeypatch.setattr(chat_load, "_Run", Watched)
    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=0.6, seed=1, grace_s=5.0)
    result = await play(spec, FakeReplica())
    assert any(t.plan.turn > 0 for t in result.turns), "some session had several turns"
    assert runs[0].sessions == {}


def test_the_tally_counts_what_the_records_say() -> None:
    from bench.chat_tally import ChatTally

    turns = [
        sent("1", [0.1 + 0.01 * i for i in range(50)], prompt=900, cached=300),
        sent("2", [0.3, 0.5, 0.9], prompt=400, cached=0),
        sent("3", [], 500, 0, "timeout"),
    ]
    turns[2].record.error = "read timeout"
    tally = ChatTally({"ttft": 200.0})
    for t in turns:
        tally.add(t.record, t.plan.session, t.planned_prompt_tokens)
    s = tally.summary(window_s=4.0)
    assert s["prompt_tokens_mean"] == pytest.approx(650.0)
    assert s["prefix_cache_hit_share"] == pytest.approx(300 / 1300)
    assert s["goodput_share"] == pytest.approx(1 / 3)  # only the first answered within 200 ms
    assert (s["requests"]["failed"], tally.first_error) == (1, "read timeout")
    assert s["itl_ms"]["n"] == 49 + 2 and s["ttft_ms"]["n"] == 2


def test_a_part_of_requests_without_gaps_is_written(tmp_path) -> None:
    from bench.chat_spool import RecordSpool
    from warehouse.run_files import read_table

    spool = RecordSpool(tmp_path, "r", rows_per_part=2)
    for t in (sent("1", [], 10, 0, "error"), sent("2", [0.5], 10, 0, "cancelled")):
        spool.add(t.record)
    assert spool.parts == 1
    assert read_table(tmp_path, "requests").num_rows == 2
    assert read_table(tmp_path, "token_gaps").num_rows == 0
