import pytest
from pydantic import ValidationError

from pipelines.config import PipelineConfig


def test_documents_in_flight_fill_every_engine_slot_by_default() -> None:
    # 2 actors beside 3 replicas of 32 slots: 96 documents, 48 per actor
    assert PipelineConfig(actors=2).docs_per_actor_for(replicas=3, engine_slots=32) == 48
    # rounded up, so the actors together never hold fewer documents than the slots
    assert PipelineConfig(actors=3).docs_per_actor_for(replicas=1, engine_slots=32) == 11


def test_documents_in_flight_as_configured() -> None:
    assert PipelineConfig(docs_per_actor=4).docs_per_actor_for(replicas=3, engine_slots=32) == 4


def test_sections_are_a_job_setting_with_documented_defaults() -> None:
    cfg = PipelineConfig()
    assert cfg.mode == "auto" and cfg.section_tokens == 8192 and cfg.overlap_tokens == 64
    assert PipelineConfig(mode="map_reduce", section_tokens=4096).section_tokens == 4096


def test_the_load_dependent_section_floor_is_gone() -> None:
    with pytest.raises(ValidationError, match="min_section_tokens"):
        PipelineConfig(min_section_tokens=256)


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"mode": "halves"}, "mode"),
        ({"section_tokens": 8}, "section_tokens"),
        ({"section_tokens": 64, "overlap_tokens": 64}, "lower overlap_tokens"),
    ],
)
def test_bad_section_settings_fail_up_front(update: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        PipelineConfig(**update)
