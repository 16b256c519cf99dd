"""Pricing one document whole against the same tokens in sections, with the plug-in's sizing."""

from bench.whole_vs_sections import PROFILE, tokens_per_s
from scheduler.step import StepBatch
from serving.engine_profile import load_profile, step_model

MODEL = step_model(load_profile(PROFILE, []), None)
CHAT = StepBatch((), 45, 45 * 8000)


def test_deep_prefixes_make_a_whole_document_slower_per_step_second_than_sections() -> None:
    whole = tokens_per_s(MODEL, 0.047, 227, CHAT, 20_000, 20_000)
    cut = tokens_per_s(MODEL, 0.047, 227, CHAT, 20_000, 2048)
    assert whole is not None and cut is not None and cut > whole > 0


def test_a_target_below_chats_own_step_leaves_no_chunk() -> None:
    assert tokens_per_s(MODEL, 0.5 * MODEL.step_seconds(CHAT), 227, CHAT, 4096, 4096) is None


def test_a_cpu_config_is_priced_with_its_own_fit(monkeypatch, capsys) -> None:
    """No roofline without a GPU: the config's latency fit prices its steps."""
    import sys
    from pathlib import Path

    from bench.whole_vs_sections import main

    config = Path(__file__).resolve().parents[2] / "engine_configs" / "cpu-small-fp32.yaml"
    argv = ["whole_vs_sections", "--engine-config", str(config), "--targets", "64",
            "--doc-tokens", "4096", "--section-tokens", "1024", "--chat-decodes", "4"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    main()
    assert "target 64 ms: whole" in capsys.readouterr().out
