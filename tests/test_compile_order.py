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


def test_several_gpu_groups_never_start_a_follower_while_its_key_compiles() -> None:
    # Two groups: job p starts when job p - 2 ends. The baseline (position 0) compiles "a".
    keys = ["a", "a", "b", "b", None]
    order = compile_order(keys, after="a", parallel=2)
    assert order == [2, 0, 1, 3, 4]
    # Position 1 compiles "b" (the baseline's "a" is still compiling), the two "a" points at
    # 2 and 3 load it, the second "b" at 4 loads what position 1 compiled, the eager point last.
    placed = {i: pos for pos, i in enumerate(order, start=1)}
    first_at = {"a": 0}
    for i in order:
        key = keys[i]
        if key is not None and key in first_at:
            assert placed[i] - first_at[key] >= 2
        elif key is not None:
            first_at[key] = placed[i]


def test_one_group_keeps_the_preferred_order() -> None:
    keys = ["a", "b", "a", None, "b"]
    assert compile_order(keys, after="b", parallel=1) == compile_order(keys, after="b") == [1, 4, 0, 2, 3]


def test_when_every_choice_loses_the_preferred_one_runs() -> None:
    # Three groups, and every point shares the baseline's key, which is still compiling.
    assert compile_order(["a", "a"], after="a", parallel=3) == [0, 1]
