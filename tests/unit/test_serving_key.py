"""The key a replica serves behind, which its warm-up must carry (else 401 and a cold replica)."""

from __future__ import annotations

from serving.engine_config import load_engine_config
from serving.launcher import serving_key
from tests.replicas import TINY

CONFIG = load_engine_config(TINY)


def test_the_flag_wins_then_the_engines_environment_then_none() -> None:
    keyed = CONFIG.model_copy(update={"vllm": {**CONFIG.vllm, "api-key": "from-flag"}})
    assert serving_key(keyed, {"VLLM_API_KEY": "from-env"}) == "from-flag"
    assert serving_key(CONFIG, {"VLLM_API_KEY": "from-env"}) == "from-env"
    assert serving_key(CONFIG, {"VLLM_API_KEY": ""}) is None
    assert serving_key(CONFIG, {}) is None
