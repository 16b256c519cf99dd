"""A chat user for fault cases: sends one short chat after another to a replica until stopped, so a
case can say what chat saw while its fault was on."""

from __future__ import annotations

import threading
import time

import httpx


class ChatUser(threading.Thread):
    """One user's chats, each `prompt` answered with exactly `max_tokens` tokens, 0.2 s apart; every
    chat is kept in `done` as (start, end, HTTP status), an error answer included."""

    def __init__(
        self, replica, key: str | None = None, prompt: str = "a chat", max_tokens: int = 24
    ) -> None:
        super().__init__(daemon=True)
        self.replica, self.key, self.prompt, self.max_tokens = replica, key, prompt, max_tokens
        self.done: list[tuple[float, float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        body = {"model": self.replica.served_model, "prompt": self.prompt,
                "max_tokens": self.max_tokens, "ignore_eos": True}  # fmt: skip
        with httpx.Client(headers=headers, timeout=60) as http:
            while not self.stop.is_set():
                t0 = time.time()
                r = http.post(f"{self.replica.base_url}/v1/completions", json=body)
                self.done.append((t0, time.time(), r.status_code))
                time.sleep(0.2)
