from pipelines.config import PipelineConfig


def test_documents_in_flight_fill_every_engine_slot_by_default() -> None:
    # 2 actors beside 3 replicas of 32 slots: 96 documents, 48 per actor
    assert PipelineConfig(actors=2).docs_per_actor_for(replicas=3, engine_slots=32) == 48
    # rounded up, so the actors together never hold fewer documents than the slots
    assert PipelineConfig(actors=3).docs_per_actor_for(replicas=1, engine_slots=32) == 11


def test_documents_in_flight_as_configured() -> None:
    assert PipelineConfig(docs_per_actor=4).docs_per_actor_for(replicas=3, engine_slots=32) == 4
