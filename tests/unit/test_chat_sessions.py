"""The pure chat model: prompt construction and growth, shared prefix, arrivals, sessions, sizes."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import pytest

from bench.chat_prompts import PromptBuilder, TemplateCost, TextPool, check_fits
from bench.chat_sessions import Arrival, ChatShape, ShapeError, plan_turns, poisson_arrivals

TEXT = (
    "The night shift begins when the office empties. A queue of long documents waits. "
    "Chat users notice every pause, and each step of the engine mixes prefill and decode. "
)


class CharTokenizer:
    """One token per character: sizes are lengths, so every planned size can be checked exactly."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()
POOL = TextPool.from_text(TEXT, TOK)
COST = TemplateCost.llama3(TOK)
SMALL = ChatShape(
    system_prompt_tokens=300,
    retrieved_chunks=3,
    chunk_tokens=40,
    documents=20,
    chunks_per_document=4,
    question_tokens_min=5,
    question_tokens_max=20,
    output_tokens_median=30,
    max_tokens=80,
    turns=4,
    think_time_s=2.0,
)


def render(messages: list[dict[str, str]]) -> str:
    """The Llama-3 chat template the local models carry, as the engine applies it."""
    body = "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in messages
    )
    return f"<|begin_of_text|>{body}<|start_header_id|>assistant<|end_header_id|>\n\n"


def play(builder: PromptBuilder, plans, answer=None):
    """Build every plan in order with its session's history, as the runner does."""
    history: dict[int, list] = defaultdict(list)
    out = []
    for plan in plans:
        prompt = builder.build(plan, history[plan.session])
        text = answer(plan) if answer else builder.stand_in_answer(plan)
        keep = builder.shape.history_keeps_context
        history[plan.session].append(prompt.history_turn(text, len(text), keep))
        out.append((plan, prompt))
    return out


def test_text_pool_slices_are_exact_and_wrap_around() -> None:
    n = len(POOL.pieces)
    assert POOL.text(0, 10) == TEXT[:10]
    assert POOL.text(n - 3, 5) == TEXT[-3:] + TEXT[:2]
    assert POOL.text(7, 3 * n) == (TEXT * 4)[7 : 7 + 3 * n]
    assert POOL.text(n + 4, 6) == TEXT[4:10]


def test_template_cost_is_measured_with_the_tokenizer() -> None:
    assert COST.user == len("<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>")
    assert COST.separator == 2
    empty = render([])
    assert COST.fixed == len(empty)


def test_system_prompt_is_byte_identical_across_sessions() -> None:
    builder = PromptBuilder(SMALL, POOL, COST)
    built = play(builder, plan_turns(poisson_arrivals(2.0, 60, seed=1), SMALL, seed=1))
    systems = {p.messages[0]["content"] for _, p in built}
    assert len({plan.session for plan, _ in built}) > 10
    assert systems == {POOL.text(0, SMALL.system_prompt_tokens)}
    assert len(systems.pop()) == SMALL.system_prompt_tokens


def test_planned_size_is_the_rendered_prompt_size() -> None:
    builder = PromptBuilder(SMALL, POOL, COST)
    built = play(builder, plan_turns(poisson_arrivals(2.0, 60, seed=2), SMALL, seed=2))
    for _, prompt in built:
        assert prompt.tokens == len(render(prompt.messages))


def test_each_turn_resends_the_previous_turns_so_the_prompt_grows() -> None:
    shape = ChatShape(**{**SMALL.to_dict(), "turns": 5, "fixed_turns": True})
    builder = PromptBuilder(shape, POOL, COST)
    built = play(
        builder,
        plan_turns(poisson_arrivals(1.0, 200, seed=3), shape, seed=3),
        answer=lambda plan: f"answer {plan.index} ",
    )
    by_session = defaultdict(list)
    for plan, prompt in built:
        by_session[plan.session].append((plan, prompt))
    long = [turns for turns in by_session.values() if len(turns) == 5]
    assert long, "some session ran all its turns"
    for turns in long:
        for (p0, a), (p1, b) in zip(turns, turns[1:], strict=False):
            assert p1.turn == p0.turn + 1 and p1.t_s > p0.t_s
            assert b.history_turns == a.history_turns + 1
            # Everything before the new question is the old prompt's prefix plus the old Q and A.
            assert b.messages[:-3] == a.messages[:-1]
            assert b.messages[-3] == {"role": "user", "content": a.question}
            assert b.messages[-2] == {"role": "assistant", "content": f"answer {p0.index} "}
            assert b.tokens > a.tokens - (shape.question_tokens_max - shape.question_tokens_min)


def test_history_can_keep_the_retrieved_context() -> None:
    shape = ChatShape(
        **{**SMALL.to_dict(), "history_keeps_context": True, "turns": 2, "fixed_turns": True}
    )
    builder = PromptBuilder(shape, POOL, COST)
    built = play(builder, plan_turns(poisson_arrivals(1.0, 100, seed=4), shape, seed=4))
    first = {plan.session: prompt for plan, prompt in built if plan.turn == 0}
    for plan, prompt in built:
        if plan.turn == 1:
            assert prompt.messages[1] == first[plan.session].messages[-1]
            assert prompt.tokens == len(render(prompt.messages))


def test_context_limit_drops_the_oldest_turns_first() -> None:
    shape = ChatShape(**{**SMALL.to_dict(), "turns": 30, "fixed_turns": True, "think_time_s": 0.1})
    limit = 1300
    builder = PromptBuilder(shape, POOL, COST, context_limit=limit)
    built = play(
        builder,
        plan_turns(poisson_arrivals(1.0, 40, seed=5), shape, seed=5),
        answer=lambda plan: f"reply {plan.index} ",
    )
    plan, prompt = max(built, key=lambda b: b[0].turn)
    before = max(p.index for p, _ in built if p.session == plan.session and p.turn == plan.turn - 1)
    assert plan.turn > 10
    assert 0 < prompt.history_turns < plan.turn
    assert prompt.messages[-2] == {"role": "assistant", "content": f"reply {before} "}
    for plan, prompt in built:
        assert prompt.tokens + plan.output_tokens <= limit
        assert prompt.tokens == len(render(prompt.messages))


@pytest.mark.parametrize("target", [120, 250, 330, 500, 1200])
def test_trace_prompt_is_filled_to_its_size(target: int) -> None:
    builder = PromptBuilder(SMALL, POOL, COST)
    arrivals = [Arrival(float(i), prompt_tokens=target, output_tokens=7) for i in range(12)]
    built = play(builder, plan_turns(arrivals, SMALL, seed=6))
    system = POOL.text(0, SMALL.system_prompt_tokens)
    for plan, prompt in built:
        assert plan.output_tokens == 7
        assert prompt.tokens == target == len(render(prompt.messages))
        # A prompt shorter than the system prompt keeps a prefix of it: cached blocks still match.
        if prompt.messages[0]["role"] == "system":
            assert system.startswith(prompt.messages[0]["content"])
        else:
            assert len(prompt.messages) == 1 and target < COST.fixed + COST.user + COST.system + 2


def test_a_trace_prompt_below_the_template_size_becomes_the_smallest_prompt() -> None:
    builder = PromptBuilder(SMALL, POOL, COST)
    ((plan, prompt),) = play(builder, plan_turns([Arrival(0.0, 10, 3)], SMALL, seed=0))
    assert prompt.messages == [{"role": "user", "content": prompt.question}]
    assert prompt.tokens == COST.fixed + COST.user + 1 == len(render(prompt.messages))


def test_trace_answer_lengths_are_capped_by_max_tokens() -> None:
    plans = plan_turns([Arrival(0.0, 500, 5000), Arrival(1.0, 500, 0)], SMALL, seed=0)
    assert [p.output_tokens for p in plans] == [SMALL.max_tokens, 1]


def test_popular_chunks_repeat_across_sessions() -> None:
    plans = plan_turns(poisson_arrivals(5.0, 100, seed=7), SMALL, seed=7)
    sessions_of = defaultdict(set)
    for p in plans:
        assert len(set(p.chunks)) == SMALL.retrieved_chunks
        for chunk in p.chunks:
            sessions_of[chunk].add(p.session)
    assert max(len(s) for s in sessions_of.values()) > 10
    docs = Counter(c // SMALL.chunks_per_document for p in plans for c in p.chunks)
    assert docs.most_common(1)[0][0] == 0  # Zipf: the first document is the most popular
    assert docs[0] > 3 * docs[SMALL.documents - 1]


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    rate, duration = 5.0, 2000.0
    times = [a.t_s for a in poisson_arrivals(rate, duration, seed=11)]
    expected = rate * duration
    assert abs(len(times) - expected) < 4 * expected**0.5
    assert times == sorted(times) and 0 <= times[0] and times[-1] < duration
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    counts = Counter(int(t) for t in times)  # per-second counts: Poisson, variance = mean
    per_second = [counts.get(s, 0) for s in range(int(duration))]
    assert statistics.pvariance(per_second) == pytest.approx(rate, rel=0.15)


def test_plans_are_deterministic_for_a_seed() -> None:
    def plan(seed: int):
        return plan_turns(poisson_arrivals(3.0, 50, seed), SMALL, seed)

    assert plan(21) == plan(21)
    assert plan(21) != plan(22)


def test_arrivals_mix_new_sessions_and_later_turns() -> None:
    shape = ChatShape(**{**SMALL.to_dict(), "turns": 4.0, "think_time_s": 1.0})
    plans = plan_turns(poisson_arrivals(10.0, 1000, seed=8), shape, seed=8)
    sessions = defaultdict(list)
    for p in plans:
        sessions[p.session].append(p)
    # Steady state: one arrival in `turns` opens a session.
    assert len(sessions) == pytest.approx(len(plans) / 4.0, rel=0.1)
    for turns in sessions.values():
        assert [p.turn for p in turns] == list(range(len(turns)))
    assert statistics.fmean(len(t) for t in sessions.values()) == pytest.approx(4.0, rel=0.1)
    assert any(p.turn > 0 for p in plans[:200]) and any(p.turn == 0 for p in plans[-200:])


def test_fixed_turns_gives_every_session_the_same_count() -> None:
    shape = ChatShape(**{**SMALL.to_dict(), "turns": 3, "fixed_turns": True, "think_time_s": 0.5})
    plans = plan_turns(poisson_arrivals(4.0, 100, seed=9), shape, seed=9)
    counts = Counter(p.session for p in plans)
    assert max(counts.values()) == 3
    assert sum(c == 3 for c in counts.values()) > 0.9 * len(counts)


def test_scaled_multiplies_every_token_size() -> None:
    small = ChatShape().scaled(0.1)
    assert (small.system_prompt_tokens, small.chunk_tokens, small.max_tokens) == (600, 50, 102)
    assert small.question_tokens_min == 1 and small.output_tokens_median == 20
    assert small.retrieved_chunks == 4 and small.turns == 4.0
    assert ChatShape(question_tokens_min=1).scaled(0.01).question_tokens_min == 1
    with pytest.raises(ShapeError, match="scale must be positive"):
        ChatShape().scaled(0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"chunk_tokens": 0}, "chunk_tokens must be at least 1"),
        ({"retrieved_chunks": 5, "documents": 1, "chunks_per_document": 4}, "exceeds the pool"),
        ({"question_tokens_min": 50, "question_tokens_max": 10}, "swap them"),
        ({"turns": 0.5}, "turns must be >= 1"),
    ],
)
def test_bad_shapes_say_what_to_change(kwargs: dict, words: str) -> None:
    with pytest.raises(ShapeError, match=words):
        ChatShape(**kwargs)


def test_a_first_turn_must_fit_the_context_window() -> None:
    check_fits(ChatShape().scaled(0.1), TemplateCost(), 4096)
    with pytest.raises(ShapeError, match="max-model-len is 4096; lower --scale"):
        check_fits(ChatShape(), TemplateCost(), 4096)
    with pytest.raises(ShapeError, match="max-model-len"):
        PromptBuilder(ChatShape(), POOL, COST, context_limit=4096)


def test_poisson_rate_must_be_positive() -> None:
    with pytest.raises(ShapeError, match="rate must be positive"):
        poisson_arrivals(0.0, 10, seed=0)
