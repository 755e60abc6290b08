"""Known configurations ordered so that those sharing a torch.compile cache key run back to
back (tuner/vllm/compile_order.py)."""

from __future__ import annotations

from tuner.vllm.compile_order import compile_order


def test_groups_by_key_in_order_of_first_appearance() -> None:
    assert compile_order(["a", "b", "a", None, "c", "b"]) == [0, 2, 1, 5, 4, 3]


def test_the_key_that_ran_just_before_goes_first() -> None:
    assert compile_order(["a", "b", "a", "b"], after="b") == [1, 3, 0, 2]
    assert compile_order(["a", "b"], after="z") == [0, 1]   # nothing shares its key


def test_uncompiled_points_last_and_everything_kept() -> None:
    keys = [None, "k", None, "k"]
    order = compile_order(keys)
    assert order == [1, 3, 0, 2] and sorted(order) == list(range(len(keys)))
    assert compile_order([]) == [] and compile_order([None]) == [0]
