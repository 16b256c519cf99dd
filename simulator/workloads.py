"""Chat traffic shaped like production: RAG sessions with Poisson arrivals, or a replayed trace.

A session is one user: a shared system prompt, the user's retrieved context, then turns whose
history grows by the user's message and the model's answer. The next turn starts a think time after
the previous answer ends, so a slow replica also slows the arrival of follow-up turns, as it does
for real users. A replayed trace's rows come from `simulator/trace.py`.

Invariant: for one seed, every policy sees the same users. Session starts draw from one stream
and each session's turns, lengths and think times from a stream of its own, so nothing a policy
changes (when an answer ends, how many turns ran before) reorders the draws. With one shared
stream, the order of completions decided every later draw: a controlled run and its chat-alone
baseline at the same seed shared under 2% of their chats, and "chat alone holds this window" spoke
of another load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from simulator.config import ChatWorkload
from simulator.entities import CHAT_PRIORITY, Request, Segment
from simulator.trace import TraceRow

SYSTEM_PROMPT = ("system",)


@dataclass(slots=True)
class ChatSession:
    """One user's conversation: what every next turn's prompt starts with."""

    sid: int
    turns_left: int
    rng: random.Random
    """This session's own draws (turn lengths, think times)."""
    replica: int = -1
    turn: int = 0
    history: list[Segment] = field(default_factory=list)


class ChatSessions:
    """Draws sessions and their turns, all from streams derived from `seed` (module docstring)."""

    def __init__(self, cfg: ChatWorkload, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.rng = random.Random(f"{seed}:arrivals")
        """Session starts and turn counts: the only draws made in arrival order."""
        self._next_sid = 0

    def session_gap_s(self) -> float:
        """Time to the next session start: turns arrive at `rate`, sessions `turns_mean` times slower."""
        return self.rng.expovariate(self.cfg.rate / self.cfg.turns_mean)

    def think_time_s(self, s: ChatSession) -> float:
        return s.rng.expovariate(1.0 / self.cfg.think_time_s) if self.cfg.think_time_s else 0.0

    def new_session(self) -> ChatSession:
        # Geometric turn count with the configured mean: each turn is the last with prob 1/mean.
        turns, p_last = 1, 1.0 / self.cfg.turns_mean
        while self.rng.random() >= p_last:
            turns += 1
        self._next_sid += 1
        sid = self._next_sid
        return ChatSession(sid, turns, random.Random(f"{self.seed}:session:{sid}"))

    def next_turn(self, s: ChatSession, now: float) -> Request:
        """The request of the session's next turn, submitted at `now`."""
        cfg, turn = self.cfg, s.turn + 1
        s.turn, s.turns_left = turn, s.turns_left - 1
        ctx_key = ("context", s.sid, turn if cfg.retrieval_per_turn else 0)
        user = Segment(("user", s.sid, turn), self._around(s, cfg.user_tokens))
        segments = [
            Segment(SYSTEM_PROMPT, cfg.system_prompt_tokens),
            Segment(ctx_key, cfg.context_tokens),
        ]
        segments = [seg for seg in segments if seg.length] + s.history + [user]
        s.history.append(user)
        return Request(
            request_id=f"chat-{s.sid}-{turn}",
            cls="chat",
            stage="chat",
            priority=CHAT_PRIORITY,
            arrival=now,
            segments=tuple(segments),
            max_output=self._around(s, cfg.output_tokens),
            output_key=("answer", s.sid, turn),
        )

    def record_answer(self, s: ChatSession, req: Request) -> None:
        """Append the answer to the history the next turn resends."""
        s.history.append(Segment(req.output_key, req.output_tokens))

    @staticmethod
    def _around(s: ChatSession, mean: int) -> int:
        """A length uniform in [mean/2, 3·mean/2]: varied, with the configured mean."""
        return max(1, s.rng.randint(max(1, mean // 2), mean + mean // 2))


def trace_request(row: TraceRow, index: int, cfg: ChatWorkload, now: float) -> Request:
    """The request one trace row stands for; only the shared prefix is common content."""
    shared = min(cfg.trace_shared_prefix_tokens, row.context_tokens)
    segments = (
        Segment(SYSTEM_PROMPT, shared),
        Segment(("trace", index), row.context_tokens - shared),
    )
    return Request(
        request_id=f"trace-{index}",
        cls="chat",
        stage="chat",
        priority=CHAT_PRIORITY,
        arrival=now,
        segments=tuple(seg for seg in segments if seg.length),
        max_output=max(1, row.generated_tokens),
        output_key=("trace-answer", index),
    )
