"""The served model's tokenizer, on the control plane.

Sections are cut in tokens, so the pipeline must count exactly as the engine does. For a model whose
files are on this machine (the local models, or a downloaded model folder) the `tokenizer.json` is
loaded with the `tokenizers` library, which needs no torch; for anything else the replica's own
`/tokenize` and `/detokenize` endpoints are asked, which is the served tokenizer by definition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import httpx

from serving.engine_config import EngineConfig


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class LocalTokenizer:
    """A `tokenizer.json` from a model folder. Special tokens are not added: prompts carry their own."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {model_dir} a model folder?")
        self._tok = HFTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


class ReplicaTokenizer:
    """The tokenizer of a running replica, through its HTTP API."""

    def __init__(self, base_url: str, model: str, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.Client(timeout=timeout_s)

    def encode(self, text: str) -> list[int]:
        r = self._http.post(
            f"{self.base_url}/tokenize",
            json={"model": self.model, "prompt": text, "add_special_tokens": False},
        )
        r.raise_for_status()
        return r.json()["tokens"]

    def decode(self, ids: list[int]) -> str:
        r = self._http.post(
            f"{self.base_url}/detokenize", json={"model": self.model, "tokens": ids}
        )
        r.raise_for_status()
        return r.json()["prompt"]


def tokenizer_for(config: EngineConfig, replica_url: str | None = None) -> Tokenizer:
    """The local tokenizer when the model's files are here, else the replica's."""
    from serving.launcher import model_location

    location = Path(model_location(config))
    if (location / "tokenizer.json").is_file():
        return LocalTokenizer(location)
    if replica_url is None:
        raise FileNotFoundError(
            f"no tokenizer.json under {location} and no replica URL to ask: pass a running "
            "replica's URL so its /tokenize endpoint can be used"
        )
    return ReplicaTokenizer(replica_url, config.model.served_name)
