import weakref

from pipelines.leftovers import release_unreferenced


class _Attempt:
    """Stands in for a failed attempt's state: held only by a reference cycle."""

    def __init__(self):
        self.me = self
        self.table = bytearray(1 << 20)


def test_what_a_failed_attempt_left_in_a_cycle_is_gone_before_the_next():
    import gc

    gc.disable()  # the cycle collector must not happen to run first
    try:
        ref = weakref.ref(_Attempt())
        assert ref() is not None
        release_unreferenced()
        assert ref() is None
    finally:
        gc.enable()
