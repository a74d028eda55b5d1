"""fusecore.plan: work plans over uneven items, persistent grids, the plan cache."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusecore.device import device_facts
from fusecore.plan import PlanCache, cdiv, make_work_plan, next_power_of_2, persistent_grid, tensor_signature


def _check_plan(costs, plan, max_piece, num_chunks, keep_empty):
    costs = costs.to(torch.int64)
    assert plan.num_chunks == num_chunks
    assert plan.chunk_ptr[0] == 0 and plan.chunk_ptr[-1] == plan.num_pieces
    assert torch.all(plan.chunk_ptr[1:] >= plan.chunk_ptr[:-1])
    # pieces tile each item's range [0, cost) exactly, in order, each within max_piece
    cover = torch.zeros_like(costs)
    for p in range(plan.num_pieces):
        item = int(plan.piece_item[p])
        start, stop = int(plan.piece_start[p]), int(plan.piece_stop[p])
        assert start == int(cover[item]), "pieces of an item must be contiguous and in order"
        assert 0 <= stop - start <= max_piece
        cover[item] = stop
    assert torch.equal(cover, costs)
    expected_pieces = (costs + max_piece - 1) // max_piece
    if keep_empty:
        expected_pieces = expected_pieces.clamp_min(1)
    assert torch.equal(plan.item_pieces, expected_pieces)
    assert torch.equal(torch.bincount(plan.piece_item, minlength=costs.numel()), expected_pieces)
    # balance: no chunk exceeds its share (with the +1 per-piece overhead) by more than one piece
    weight_total = int(costs.sum()) + plan.num_pieces
    chunk_weight = plan.chunk_costs() + (plan.chunk_ptr[1:] - plan.chunk_ptr[:-1])
    assert int(chunk_weight.sum()) == weight_total
    assert (int(chunk_weight.max()) if chunk_weight.numel() else 0) <= weight_total / num_chunks + max_piece + 1


@settings(max_examples=60, deadline=None)
@given(
    costs=st.lists(st.integers(0, 500), min_size=0, max_size=60),
    max_piece=st.integers(1, 64),
    num_chunks=st.integers(1, 40),
    keep_empty=st.booleans(),
)
def test_work_plan_properties(costs, max_piece, num_chunks, keep_empty):
    costs = torch.tensor(costs, dtype=torch.int32)
    plan = make_work_plan(costs, max_piece_cost=max_piece, num_chunks=num_chunks, keep_empty=keep_empty)
    _check_plan(costs, plan, max_piece, num_chunks, keep_empty)


def test_super_item_is_split_and_balanced():
    costs = torch.tensor([3, 1_000_000, 2, 0, 7])
    plan = make_work_plan(costs, max_piece_cost=1000, num_chunks=132, keep_empty=True)
    assert int(plan.item_pieces[1]) == 1000
    chunk = plan.chunk_costs()
    assert int(chunk.max()) <= 1_000_012 / 132 + 1001
    moved = plan.to("cpu", torch.int32)
    assert moved.piece_item.dtype == torch.int32


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(costs=torch.tensor([1.0]), max_piece_cost=1, num_chunks=1), "integer"),
        (dict(costs=torch.tensor([[1]]), max_piece_cost=1, num_chunks=1), "1-D"),
        (dict(costs=torch.tensor([1, -2]), max_piece_cost=1, num_chunks=1), "non-negative"),
        (dict(costs=torch.tensor([1]), max_piece_cost=0, num_chunks=1), "max_piece_cost"),
        (dict(costs=torch.tensor([1]), max_piece_cost=1, num_chunks=0), "num_chunks"),
    ],
)
def test_work_plan_rejects_bad_input(kwargs, match):
    costs = kwargs.pop("costs")
    with pytest.raises((ValueError, TypeError), match=match):
        make_work_plan(costs, **kwargs)


def test_persistent_grid():
    sms = device_facts().sm_count
    assert persistent_grid(10**9) == sms
    assert persistent_grid(10**9, programs_per_sm=4) == 4 * sms
    assert persistent_grid(1) == 1
    assert persistent_grid(0) == 1
    with pytest.raises(ValueError):
        persistent_grid(-1)
    with pytest.raises(ValueError):
        persistent_grid(5, programs_per_sm=0)
    assert cdiv(10, 3) == 4 and cdiv(0, 3) == 0
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 4, 64, 128]
    assert next_power_of_2(np.int64(5)) == 8
    for bad in (2.5, True, "4"):
        with pytest.raises(TypeError, match="n must be an int"):
            next_power_of_2(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_facts_without_cuda_says_so():
    for device in ("cuda:0", "cuda", 0):
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            device_facts(device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_facts_names_a_missing_device():
    with pytest.raises(ValueError, match="does not exist"):
        device_facts(torch.cuda.device_count())


def test_plan_cache_builds_once_and_evicts_lru():
    cache = PlanCache(maxsize=2)
    calls = []

    def build(k):
        calls.append(k)
        return f"plan-{k}"

    assert cache.get("a", lambda: build("a")) == "plan-a"
    assert cache.get("a", lambda: build("a")) == "plan-a"
    assert (cache.hits, cache.misses) == (1, 1)
    cache.get("b", lambda: build("b"))
    cache.get("a", lambda: build("a"))  # a is now most recent
    cache.get("c", lambda: build("c"))  # evicts b
    assert "b" not in cache and "a" in cache and len(cache) == 2
    assert calls == ["a", "b", "c"]
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError):
        PlanCache(maxsize=0)


def test_tensor_signature():
    a = torch.zeros(2, 3)
    assert tensor_signature(a, None) == (((2, 3), "torch.float32", "cpu"), None)
    assert hash(tensor_signature(a))


def test_huge_costs_split_exactly_and_knobs_are_integers():
    """floor(k c / n) without the product k · c, which overflowed int64 (session 38's audit: a cost of 2**50
    in 2**31-unit pieces gave negative starts and pieces summing to 3)."""
    plan = make_work_plan(torch.tensor([2**50, 3]), max_piece_cost=2**31, num_chunks=4)
    cost = plan.piece_stop - plan.piece_start
    assert int(plan.piece_start.min()) == 0 and int(cost.sum()) == 2**50 + 3 and int(cost.max()) <= 2**31
    assert int(cost[:-1].sum()) == 2**50
    top = make_work_plan(torch.tensor([2**63 - 1]), max_piece_cost=2**62, num_chunks=2)
    assert top.piece_stop.tolist()[-1] == 2**63 - 1
    for name, bad in (("max_piece_cost", 2.5), ("num_chunks", 2.5), ("num_chunks", True)):
        with pytest.raises(TypeError, match=name):
            make_work_plan(torch.tensor([4]), **{"max_piece_cost": 2, "num_chunks": 2, name: bad})


def test_persistent_grid_takes_integer_counts():
    assert persistent_grid(500, "cpu", programs_per_sm=2) == min(500, 2 * device_facts("cpu").sm_count)
    for kwargs, name in (({"programs_per_sm": 1.5}, "programs_per_sm"), ({"num_work": 2.0}, "num_work")):
        with pytest.raises(TypeError, match=name):  # a float count once came back as a float grid
            persistent_grid(**{"num_work": 500, "device": "cpu", **kwargs})


def test_plan_cache_takes_an_integer_size():
    """PlanCache(float('nan')) once made a cache that never evicted (len > nan is always False), and True or 2.5 were
    taken as sizes: the size must be an int >= 1."""
    for bad in (float("nan"), float("inf"), 2.5, True, "3"):
        with pytest.raises(TypeError, match="PlanCache: maxsize must be an int"):
            PlanCache(bad)
    assert PlanCache(np.int64(3)).maxsize == 3


def test_work_plan_keep_empty_is_a_bool():
    """keep_empty='no' once kept empty items (bool('no') is True): the flag must be True or False."""
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match="keep_empty must be True or False"):
            make_work_plan(torch.tensor([0, 2]), max_piece_cost=2, num_chunks=1, keep_empty=bad)


def test_device_facts_refuses_a_bool():
    """device_facts(True) was read as CUDA device 1 (a bool is an int to Python)."""
    with pytest.raises(TypeError, match="device_facts: device must be"):
        device_facts(True)
