"""PowerSGD's checkpointed state is applied only to the DDP buckets it was kept for
(`labkit.torch.compression.BucketLayout`): after a resume DDP's first buckets differ from the
rebuilt ones the state was saved from."""

from __future__ import annotations

import pytest


class _Bucket:
    """What the hook reads of DDP's GradBucket: its index and parameters."""

    def __init__(self, index, params):
        self._index, self._params = index, params

    def index(self):
        return self._index

    def parameters(self):
        return self._params


class _State:
    def __init__(self):
        self.error_dict, self.p_memory_dict, self.q_memory_dict = {0: "e0"}, {0: "p0"}, {0: "q0"}


def _layout():
    torch = pytest.importorskip("torch")
    from labkit.torch.compression import BucketLayout

    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    seen = []
    layout = BucketLayout(lambda state, bucket: seen.append(bucket.index()), {id(a): "a", id(b): "b"})
    return layout, a, b, seen


def test_a_restored_state_is_kept_while_the_buckets_hold_the_same_parameters():
    layout, a, b, seen = _layout()
    layout.expect({0: ("a", "b")})
    state = _State()
    layout(state, _Bucket(0, [a, b]))
    assert state.error_dict == {0: "e0"} and seen == [0] and layout.layout == {0: ("a", "b")}


def test_a_bucket_that_changed_starts_the_feedback_afresh_with_a_warning():
    layout, a, b, seen = _layout()
    layout.expect({0: ("a", "b")})
    state = _State()
    with pytest.warns(UserWarning, match="bucket 0 holds other parameters"):
        layout(state, _Bucket(0, [b]))
    assert state.error_dict == state.p_memory_dict == state.q_memory_dict == {} and seen == [0]
    layout(state, _Bucket(1, [a]))  # warned once: the fresh state is this run's own
    assert layout.expected is None


def test_the_layout_travels_with_the_checkpointed_state():
    pytest.importorskip("torch")
    from labkit.torch import compression

    hook, state = compression.hook("powersgd", 1, "cpu", {})
    hook.layout[0] = ("a",)
    saved = compression.state_dict(state)
    assert saved["bucket_layout"] == {0: ("a",)}
    fresh_hook, fresh = compression.hook("powersgd", 1, "cpu", {})
    compression.load_state_dict(fresh, saved, "cpu")
    assert fresh_hook.expected == {0: ("a",)} and not hasattr(fresh, "bucket_layout")
