"""fusecore.softmax: the online rescale in a kernel and the logsumexp merge, against float64.

A row of scores is cut into pieces; each piece runs the online softmax of the attention
kernels (blocks of scores, running max ``m``, sum ``l`` and weighted sum ``acc`` rescaled by
:func:`online_rescale`) and writes its normalized partial output and logsumexp; the pieces
merge with :func:`merge_partials`.  The result must equal a float64 softmax over the whole
row for scores from tiny to huge magnitudes, and for rows with empty pieces.
"""

import math

import numpy as np
import pytest
import torch
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusecore.backend import jit
from fusecore.softmax import merge_partials, online_rescale, online_update
from fusecore.testing import assert_all_written, poisoned, test_device


@jit
def _piece_softmax_kernel(score_ptr, value_ptr, bounds_ptr, out_ptr, lse_ptr, D,
                          BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    piece = tl.program_id(0)
    start = tl.load(bounds_ptr + piece)
    stop = tl.load(bounds_ptr + piece + 1)
    offs_e = tl.arange(0, BLOCK_E)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    total = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for e0 in range(start, stop, BLOCK_E):
        pos = e0 + offs_e
        e_mask = pos < stop
        s = tl.load(score_ptr + pos, mask=e_mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        rescale = online_rescale(m, m_new)
        p = tl.exp(s - m_new)
        total = total * rescale + tl.sum(p, axis=0)
        v = tl.load(value_ptr + pos[:, None] * D + offs_d[None, :], mask=e_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    empty = total == 0.0
    safe_total = tl.where(empty, 1.0, total)
    lse = tl.where(empty, float("-inf"), m + tl.log(safe_total))
    tl.store(out_ptr + piece * D + offs_d, acc / safe_total, mask=d_mask)
    tl.store(lse_ptr + piece + tl.arange(0, 1), lse)


def _fused_row(scores: torch.Tensor, values: torch.Tensor, cuts: list[int], block_e: int):
    device = test_device()
    bounds = torch.tensor([0, *cuts, scores.numel()], dtype=torch.int32, device=device)
    pieces, width = bounds.numel() - 1, values.shape[1]
    out = poisoned((pieces, width), torch.float32, device)
    lse = poisoned((pieces,), torch.float32, device)
    _piece_softmax_kernel[(pieces,)](
        scores.to(device), values.to(device), bounds, out, lse, width,
        BLOCK_E=block_e, BLOCK_D=max(2, 1 << (width - 1).bit_length()),
    )
    assert_all_written(out, "partial outputs")
    return merge_partials(out.cpu().double(), lse.cpu().double(), dim=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    length=st.integers(1, 40),
    width=st.integers(1, 5),
    log_scale=st.floats(-6.0, 4.0),
    shift=st.floats(-1e4, 1e4),
    data=st.data(),
)
def test_pieces_merged_by_logsumexp_equal_float64_softmax(length, width, log_scale, shift, data):
    """Scores of scale 1e-6 .. 1e4 around any offset: no overflow, no NaN, float64-close."""
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randn(length, generator=gen, dtype=torch.float64) * 10.0**log_scale + shift).float()
    values = torch.randn(length, width, generator=gen)
    cuts = sorted(data.draw(st.lists(st.integers(0, length), max_size=4), label="cuts"))
    block_e = data.draw(st.sampled_from([2, 4, 16]), label="BLOCK_E")
    merged, lse = _fused_row(scores, values, cuts, block_e)

    s64 = scores.double()
    want_lse = torch.logsumexp(s64, dim=0)
    want = torch.softmax(s64, dim=0) @ values.double()
    assert torch.isfinite(merged).all() and torch.isfinite(lse)
    # float32 scores: the absolute lse error is a few ulps of the largest |score|
    assert abs(float(lse - want_lse)) <= 1e-6 * max(1.0, float(s64.abs().max())) * 8
    # the reference softmaxes the same float32 scores; the pieces' float32 logsumexps carry an
    # absolute error of a few ulps of |score|, which becomes the merge weights' relative error
    ulps = 4 * 2.0**-23 * float(s64.abs().max())
    np.testing.assert_allclose(merged.numpy(), want.numpy(), rtol=1e-5 + ulps, atol=1e-5 + ulps)


def test_all_pieces_empty_give_zeros_and_minus_inf():
    scores = torch.zeros(0)
    values = torch.zeros(0, 3)
    merged, lse = _fused_row(scores, values, [0, 0], block_e=4)
    assert merged.shape == (3,) and torch.equal(merged, torch.zeros(3, dtype=torch.float64))
    assert lse.item() == -math.inf


@jit
def _rescale_kernel(m_old_ptr, m_new_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, online_rescale(tl.load(m_old_ptr + offs), tl.load(m_new_ptr + offs)))


def test_online_rescale_empty_state_is_zero_not_nan():
    """exp(m_old - m_new), with the empty state (m_old = -inf) giving 0 even when m_new is -inf."""
    device = test_device()
    m_old = torch.tensor([-math.inf, -math.inf, 1.0, -3.5], device=device)
    m_new = torch.tensor([0.0, -math.inf, 3.0, -3.5], device=device)
    out = poisoned((4,), torch.float32, device)
    _rescale_kernel[(1,)](m_old, m_new, out, BLOCK=4)
    torch.testing.assert_close(out.cpu(), torch.tensor([0.0, 0.0, math.exp(-2.0), 1.0]), rtol=1e-6, atol=0)


@jit
def _update_kernel(s_ptr, out_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Fold STEPS score vectors into a running (max, sum, weighted sum of the step index)."""
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(STEPS):
        m, rescale, p, total = online_update(m, total, tl.load(s_ptr + k * BLOCK + offs))
        acc = acc * rescale + p * k
    tl.store(out_ptr + offs, m)
    tl.store(out_ptr + BLOCK + offs, total)
    tl.store(out_ptr + 2 * BLOCK + offs, acc / tl.where(total > 0, total, 1.0))


def test_online_update_matches_a_float64_softmax_and_keeps_empty_states_empty():
    """online_update folded over steps gives the max, Σ exp(s − max) and the softmax-weighted mean of
    the step index; a lane whose scores are all −inf keeps max −inf and sum 0 (no NaN)."""
    device = test_device()
    gen = torch.Generator().manual_seed(3)
    steps, block = 5, 8
    scores = torch.randn(steps, block, generator=gen) * 4
    scores[:, 0] = -math.inf                      # an empty lane
    scores[:2, 1] = -math.inf                     # a lane that starts empty
    out = poisoned((3 * block,), torch.float32, device)
    _update_kernel[(1,)](scores.to(device), out, STEPS=steps, BLOCK=block)
    m, total, mean = out.cpu().double().reshape(3, block)
    s = scores.double()
    ref_m = s.max(0).values
    safe = torch.where(torch.isinf(ref_m), 0.0, ref_m)
    weights = torch.exp(s - safe)
    ref_total = weights.sum(0)
    ref_mean = (weights * torch.arange(steps, dtype=torch.float64)[:, None]).sum(0) / ref_total.clamp_min(1e-300)
    assert m[0].item() == -math.inf and total[0].item() == 0.0 and mean[0].item() == 0.0
    torch.testing.assert_close(m[1:], ref_m[1:], rtol=0, atol=0)
    torch.testing.assert_close(total[1:], ref_total[1:], rtol=1e-6, atol=0)
    torch.testing.assert_close(mean[1:], ref_mean[1:], rtol=1e-5, atol=1e-6)


def test_merge_partials_negative_dim_and_bad_shapes():
    """merge_partials(out, lse, dim=-1) once summed out's last axis (the features) instead of the pieces: a wrong
    shape and wrong values, without a word.  dim counts lse's axes; shapes that do not pair are refused."""
    gen = torch.Generator().manual_seed(3)
    out = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    lse = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    want = merge_partials(out, lse, dim=1)
    for dim in (-1, 1):
        got = merge_partials(out, lse, dim=dim)
        assert got[0].shape == (2, 4) and got[1].shape == (2,)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(merge_partials(out, lse, dim=-2)[0], merge_partials(out, lse, dim=0)[0])
    with pytest.raises(ValueError, match=r"merge_partials: out must have lse's shape \[2, 2\] plus a last axis"):
        merge_partials(out, lse[:, :2])
    with pytest.raises(ValueError, match=r"merge_partials: out must have lse's shape \[2, 1\] plus a last axis"):
        merge_partials(out, lse[:, :1])  # once broadcast into a "merge" of three copies
    with pytest.raises(ValueError, match=r"merge_partials: dim must be an int in \[-2, 2\), got 2"):
        merge_partials(out, lse, dim=2)
