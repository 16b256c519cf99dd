"""The heap frozen while a chat load measures: what it sets aside, and that it gives it all back."""

from __future__ import annotations

import gc
import weakref

import pytest

from bench.chat_load import ChatLoadSpec
from bench.frozen_heap import frozen_heap
from tests.unit.test_chat_load import SHAPE, FakeReplica, play


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref:
    """A garbage cycle, unreachable once this returns; the weak reference says whether it lives."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def _unfrozen():
    assert gc.get_freeze_count() == 0, "the test process starts with nothing frozen"
    yield
    gc.unfreeze()


def test_garbage_on_entry_is_collected_and_what_lived_then_is_kept_until_exit() -> None:
    dead = cycle()
    kept = Node()
    kept.other = Node()
    kept.other.other = kept  # a cycle alive on entry
    alive = weakref.ref(kept)
    with frozen_heap():
        assert dead() is None, "garbage on entry is collected, not frozen"
        assert gc.get_freeze_count() > 0
        del kept  # cyclic garbage now, but frozen
        new = cycle()
        gc.collect()
        assert alive() is not None, "the heap held on entry is not scanned"
        assert new() is None, "what the block makes is collected as usual"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_nested_and_overlapping_blocks_unfreeze_on_the_last_exit_only() -> None:
    outer = frozen_heap()
    outer.__enter__()
    inner = frozen_heap()
    inner.__enter__()
    outer.__exit__(None, None, None)  # loads may end in any order
    assert gc.get_freeze_count() > 0, "the inner block still measures"
    inner.__exit__(None, None, None)
    assert gc.get_freeze_count() == 0


async def test_a_chat_load_runs_on_a_frozen_heap_and_leaves_it_unfrozen() -> None:
    frozen_while_streaming: list[int] = []

    class Watching(FakeReplica):
        async def handle(self, request):
            frozen_while_streaming.append(gc.get_freeze_count())
            return await super().handle(request)

    spec = ChatLoadSpec(shape=SHAPE, rate=20.0, duration_s=0.3, seed=1, grace_s=5.0)
    result = await play(spec, Watching())
    assert result.records and frozen_while_streaming
    assert min(frozen_while_streaming) > 0
    assert gc.get_freeze_count() == 0
