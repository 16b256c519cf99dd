import pytest

from bench.scenarios import in_sections
from bench.scoring import (
    batch_throughput,
    bound_tokens_per_s,
    chat_decode_load,
    chat_latency,
    chat_prompt_share,
    window_verdicts,
)
from bench.verdicts import itl_floor_ms, pick_static, slo_from_chat_only
from pipelines.config import PipelineConfig
from scheduler.latency_model import LatencyModel
from scheduler.records import RequestRecord
from scheduler.slo import SLO

SLO_10S = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=500, window_s=10)


def chat(t_submit: float, ttft: float, gap: float, n: int, status: str = "ok") -> RequestRecord:
    r = RequestRecord("r", f"c{t_submit}", "chat", "chat", "a", t_submit=t_submit)
    times = [t_submit + ttft + i * gap for i in range(n)]
    r.finish(times, times[-1] if times else t_submit + 1)
    r.status = status  # type: ignore[assignment]
    r.prompt_tokens, r.output_tokens = 100, n
    return r


def test_latency_is_token_weighted_for_itl() -> None:
    fast = chat(0, 0.1, 0.01, 101)  # 100 gaps of 10 ms
    slow = chat(1, 0.1, 1.0, 2)  # 1 gap of 1 s
    lat = chat_latency([fast, slow])
    assert abs(lat["itl_ms"]["p50"] - 10.0) < 1e-6  # a per-request average would say ~500
    assert abs(lat["ttft_ms"]["p50"] - 100.0) < 1e-6 and lat["errors"] == 0


def test_windows_judge_itl_ttft_and_failures_separately() -> None:
    records = [
        chat(1, 0.1, 0.01, 20),  # window 0: fine
        chat(11, 0.1, 0.2, 5),  # window 1: ITL 200 ms breaks it
        chat(21, 0.9, 0.01, 5),  # window 2: TTFT 900 ms breaks it
        chat(31, 0.1, 0.01, 5, status="error"),
    ]  # window 3: a failure breaks it
    assert window_verdicts(records, 0, 50, SLO_10S) == [True, False, False, False, True]


def test_an_e2e_slo_judges_each_window_by_the_chats_that_ended_in_it() -> None:
    records = [
        chat(1, 0.1, 0.01, 5),  # ends in window 0 after 0.14 s
        chat(2, 0.1, 1.0, 10),  # 9.1 s E2E, ITL gaps of 1 s judged apart: ends in window 1
    ]
    no_itl = lambda t0, t1: None  # noqa: E731 (ITL out of the way: only E2E is judged here)
    assert window_verdicts(records, 0, 20, SLO_10S, no_itl) == [True, True]
    with_e2e = SLO_10S.model_copy(update={"chat_e2e_p99_ms": 5000})
    assert window_verdicts(records, 0, 20, with_e2e, no_itl) == [True, False]


def test_goodput_counts_only_windows_that_held() -> None:
    rows = [
        {"status": "ok", "t_end": 5, "prompt_tokens": 900, "output_tokens": 100},
        {"status": "ok", "t_end": 15, "prompt_tokens": 400, "output_tokens": 100},
        {"status": "error", "t_end": 6, "prompt_tokens": 999, "output_tokens": 0},
        {"status": "ok", "t_end": 25, "prompt_tokens": 1, "output_tokens": 1},
    ]  # outside
    out = batch_throughput(rows, 0, 20, SLO_10S, [True, False])
    assert out == {"tokens_per_s": 1500 / 20, "slo_batch_tokens_per_s": 1000 / 20}


def test_decode_load_is_littles_law() -> None:
    # Two requests decoding for 5 s each within a 10 s window: one sequence on average.
    records = [chat(0, 0.0, 0.05, 101), chat(5, 0.0, 0.05, 101)]
    seqs, ctx = chat_decode_load(records, 0, 10)
    assert abs(seqs - 1.0) < 1e-6 and ctx == 100 + 101 / 2


def test_bound_shrinks_with_a_tighter_slo() -> None:
    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=1e-8, overhead_s=0.005)
    loose = bound_tokens_per_s(model, SLO(chat_itl_p99_ms=60), 4, 1000, 32768)
    tight = bound_tokens_per_s(model, SLO(chat_itl_p99_ms=10), 4, 1000, 32768)
    assert loose > tight > 0
    assert bound_tokens_per_s(model, SLO(chat_itl_p99_ms=4), 4, 1000, 32768) == 0.0


def scored(met: float, tps: float, errors: int = 0) -> dict:
    return {"chat": {"slo_windows_met": met, "errors": errors}, "batch": {"tokens_per_s": tps}}


def test_static_pick_is_the_fastest_that_held() -> None:
    sweep = {"1x512": scored(1.0, 100), "2x1024": scored(1.0, 300), "4x2048": scored(0.5, 900)}
    assert pick_static(sweep) == "2x1024"
    assert pick_static({"a": scored(0.5, 9), "b": scored(0.75, 1)}) == "b"


def test_itl_floor_is_two_full_steps_and_grows_with_the_step() -> None:
    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=0.0, overhead_s=0.002)
    # 512 prefill tokens + 1 decode token at 10 µs each, plus 2 ms overhead, twice.
    assert itl_floor_ms(model, 512) == round(2 * (513 * 1e-5 + 0.002) * 1000, 1)
    assert itl_floor_ms(model, 256) < itl_floor_ms(model, 512)


def test_a_derived_itl_slo_is_no_tighter_than_its_floor() -> None:
    chat = {"itl_ms": {"p99": 4.0}, "ttft_ms": {"p99": 30.0}}
    assert slo_from_chat_only(chat, 3.0, 15.0).chat_itl_p99_ms == 12.0
    floored = slo_from_chat_only(chat, 3.0, 15.0, itl_floor_ms=18.2)
    assert floored.chat_itl_p99_ms == 18.2 and floored.chat_ttft_p99_ms == 90.0
    # a slower chat-only run sets it above the floor
    chat["itl_ms"]["p99"] = 8.0
    assert slo_from_chat_only(chat, 3.0, 15.0, itl_floor_ms=18.2).chat_itl_p99_ms == 24.0


def test_the_static_engine_sweep_sends_documents_in_sections_of_its_caps() -> None:
    job = PipelineConfig(max_model_len=8192, ignore_eos=True, final_summary_tokens=48)
    swept = in_sections(job, 1024)
    assert (swept.mode, swept.section_tokens) == ("map_reduce", 1024)
    assert swept.model_dump(exclude={"mode", "section_tokens"}) == job.model_dump(
        exclude={"mode", "section_tokens"}
    )
    with pytest.raises(ValueError, match="section_tokens"):
        in_sections(job, 8)


def test_a_scenario_that_ran_out_of_documents_is_named_and_reported() -> None:
    from bench.report import corpus_warning
    from bench.verdicts import corpus_bound

    scored = {
        "chat-only": {"batch": {"docs_done": 0}},
        "uncontrolled": {"batch": {"docs_done": 200}},
        "controlled": {"batch": {"docs_done": 150}},
    }
    assert corpus_bound(scored, 200) == ["uncontrolled"]
    assert corpus_bound(scored, 300) == [] and corpus_bound(scored, None) == []
    warning = corpus_warning({"summary": {"corpus_bound": ["uncontrolled"]}})
    assert warning is not None and "uncontrolled" in warning and "--docs" in warning
    assert corpus_warning({"summary": {"corpus_bound": []}}) is None


def test_the_default_corpus_grows_with_the_scenario() -> None:
    from bench.bench_options import default_docs

    assert default_docs(90) == 225 and default_docs(180) == 450 and default_docs(10) == 200


def test_the_bound_walks_each_prompt_so_a_long_one_whole_bounds_lower_than_sections() -> None:
    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=1e-8, overhead_s=0.005)
    slo = SLO(chat_itl_p99_ms=60)
    whole = bound_tokens_per_s(model, slo, 4, 1000, 4096, [80_000])
    sections = bound_tokens_per_s(model, slo, 4, 1000, 4096, [2048] * 40)
    assert 0 < whole < sections
    # A prompt one whole chunk long is the single chunk at position 0, as without prompts.
    assert bound_tokens_per_s(model, slo, 4, 1000, 512, [512]) == pytest.approx(
        bound_tokens_per_s(model, slo, 4, 1000, 512)
    )


def test_each_prompt_is_priced_as_if_prefilled_alone_whatever_the_other_lengths() -> None:
    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=1e-8, overhead_s=0.005)
    slo = SLO(chat_itl_p99_ms=60)
    lengths = list(range(1000, 1200, 7))  # sections of many lengths, as map-reduce sends them
    alone = [length / bound_tokens_per_s(model, slo, 4, 1000, 512, [length]) for length in lengths]
    together = bound_tokens_per_s(model, slo, 4, 1000, 512, lengths)
    assert together == pytest.approx(sum(lengths) / sum(alone))


def test_chat_prompts_take_the_steps_they_fill_from_the_bound() -> None:
    from scheduler.step import PrefillChunk, StepBatch

    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=1e-8, overhead_s=0.005)
    prompt = chat(1, 0.1, 0.01, 10)
    prompt.prompt_tokens, prompt.cached_tokens = 1000, 200  # 800 to prefill from position 200
    late = chat(20, 0.1, 0.01, 10)  # first token after the span: not counted

    def step(tokens: int, position: int) -> float:
        return model.step_seconds(StepBatch((PrefillChunk(tokens, position),), 4, 4000))

    # Chunks of 300 in a step with room for 400: 300, 300 and a last 200, each the share of the
    # room it fills; the cached prefix is not prefilled again.
    share = chat_prompt_share(model, [prompt, late], 0, 10, 4, 1000, 300, 400)
    expected = (step(300, 200) * 0.75 + step(300, 500) * 0.75 + step(200, 800) * 0.5) / 10
    assert share == pytest.approx(expected)
    slo = SLO(chat_itl_p99_ms=60)
    free = bound_tokens_per_s(model, slo, 4, 1000, 4096, [20_000])
    beside = bound_tokens_per_s(model, slo, 4, 1000, 4096, [20_000], chat_prompt_share=share)
    assert beside == pytest.approx(free * (1 - share)) and beside < free


def test_a_host_faster_than_its_fit_is_priced_as_the_plugin_measured_it() -> None:
    from bench.report import fit_note
    from bench.verdicts import MeasuredModel, measured_step_ratio

    rows = [{"step_time_ratio": r, "batch_prefill_tokens": 64} for r in (0.6, None, 0.7, 0.0, 0.65)]
    assert measured_step_ratio(rows) == pytest.approx(0.65)  # unpriced intervals left out
    chat_alone = [{"step_time_ratio": r, "batch_prefill_tokens": 0} for r in (1.4, 1.5, 1.6)]
    assert measured_step_ratio(rows + chat_alone) == pytest.approx(0.65)  # batch steps only
    assert measured_step_ratio(chat_alone) is None
    assert measured_step_ratio([{"step_time_ratio": None, "batch_prefill_tokens": 64}]) is None
    model = LatencyModel(s_per_token=1e-5, s_per_attention_unit=1e-8, overhead_s=0.005)
    slo = SLO(chat_itl_p99_ms=60)
    as_fit = bound_tokens_per_s(model, slo, 4, 1000, 4096, [20_000])
    here = bound_tokens_per_s(MeasuredModel(model, 0.65), slo, 4, 1000, 4096, [20_000])
    assert here > as_fit * 1.2  # faster steps fit larger chunks in the same SLO
    note = fit_note({"summary": {"step_time_ratio": 0.65, "bound_tokens_per_s_measured": here}})
    assert note is not None and "0.65x" in note and "nightshift calibrate" in note
    assert fit_note({"summary": {"step_time_ratio": None}}) is None
    probed = {"summary": {}, "slo_basis": {"floor_step_ratio": 0.64, "itl_floor_ms": 39.8,
                                           "itl_floor_ms_fit": 62.2}}  # fmt: skip
    note = fit_note(probed)
    assert note is not None and "0.64x" in note and "39.8 ms" in note and "62.2 ms" in note


def test_the_summary_carries_the_measured_bound_beside_the_fits() -> None:
    from bench.verdicts import summary

    scored = {
        "controlled": {"batch": {"tokens_per_s": 900.0, "slo_batch_tokens_per_s": 900.0}},
    }
    plain = summary(scored, SLO(), 1000.0, 2.0, 900.0, 0.1)
    assert plain["step_time_ratio"] is None and plain["controlled_fraction_of_bound"] == 0.9
    measured = summary(scored, SLO(), 1000.0, 2.0, 900.0, 0.1, measured=(0.6, 1500.0))
    assert measured["step_time_ratio"] == 0.6
    assert measured["controlled_fraction_of_bound_measured"] == pytest.approx(0.6)
