"""Policies evaluated inside the rollout kernel: an MLP of any depth and its action heads.

MLP (weights zero-padded on the host, see :mod:`simfuse.policy`), for an observation tile
``x`` [BLOCK, D_PAD] and HIDDEN hidden layers of (padded) width P::

    h_1 = act_1(x W_in + b_in)                         W_in  [D_PAD, P]
    h_l = act_l(h_{l-1} W_hid[l-2] + b_hid[l-2])       W_hid [HIDDEN - 1, P, P],  l = 2..HIDDEN
    out = h_HIDDEN W_out + b_out                       W_out [P, A_PAD]

(HIDDEN = 0, a linear policy: out = x W_out + b_out with W_out [D_PAD, A_PAD].)  Layers of
unequal widths are zero-padded to the widest: a padded unit has zero weights and bias, so it
stays 0 under tanh, ReLU and the identity and adds nothing downstream.  ``ACTS`` holds the
activation of hidden layer l in bits 2(l−1)..2(l−1)+1: 0 tanh, 1 ReLU, 2 identity (two Linear
layers in a row).  The loop over layers is unrolled at compile time.

Precision: "ieee" multiplies in float32 on the CUDA cores (log-probabilities agree with
PyTorch's float32 forward to ~1e-6) with an exact tanh; "tf32" uses the tensor cores with
float32 operands rounded to 10-bit mantissas; "bf16" / "fp16" store the weights and cast the
activations to 16 bits (twice the tensor-core rate of tf32, half the bytes), accumulating in
float32 (the interpreter, which cannot compute in bfloat16, gets bfloat16-rounded weights in
float32).  The three fast modes compute tanh with the hardware's ``tanh.approx.f32`` (one
special-function instruction, relative error ~5e-4) when compiled.  Heads:

* categorical (discrete, n ≤ 64 actions): log π(a) = out_a − logsumexp(out); the action by
  inverse-CDF sampling with one Philox uniform u: a = #{j < n − 1 : F_j ≤ u F_{n−1}},
  F_j = Σ_{k≤j} exp(out_k − max out) (the total F_{n−1} is the last running sum, as in
  :func:`simfuse.reference.sample_categorical`);
* Gaussian (continuous, one dimension): a = μ + σ z with z the Philox normal of the step,
  log π(a) = −z²/2 − log σ − log(2π)/2.

The weights are loaded inside the step loop, through L1/L2 (a 2x64 float32 MLP is 24 KiB;
kept in registers for the whole loop it would spill): an MLP policy adds no device-memory
traffic per step beyond the log-probability (and value) it writes.  Measured on an H200 (2x64
tanh actor, CartPole-v1, 1 M envs x 64 steps): 1.46e10 env-steps/s in bf16, 7.6e9 in tf32,
1.2e9 in ieee float32.
"""

import triton.language as tl

from fusecore.backend import INTERPRET, jit

HALF_LOG_TWO_PI: tl.constexpr = tl.constexpr(0.9189385332046727)
TANH: tl.constexpr = tl.constexpr(0)
RELU: tl.constexpr = tl.constexpr(1)
# The interpreter cannot execute PTX: it takes the formula path of the fast tanh.
HARDWARE_TANH: tl.constexpr = tl.constexpr(not INTERPRET)


@jit
def activate(x, CODE: tl.constexpr, FAST: tl.constexpr):
    """tanh (CODE 0), ReLU (1) or the identity (2).

    Exact tanh: from exp(-2|x|), accurate to float32 rounding for every x (no cancellation
    near 0).  FAST: the hardware tanh.approx.f32 when compiled (the interpreter evaluates
    1 − 2 / (exp(2x) + 1)).
    """
    if CODE == TANH:
        if FAST:
            if HARDWARE_TANH:
                y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                              is_pure=True, pack=1)
            else:
                y = 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
        else:
            e = tl.exp(-2.0 * tl.abs(x))
            t = (1.0 - e) / (1.0 + e)
            y = tl.where(x >= 0.0, t, -t)
    elif CODE == RELU:
        y = tl.maximum(x, 0.0)
    else:
        y = x
    return y


@jit
def dense(x, w_ptr, b_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """x [BLOCK, ROWS] @ W [ROWS, COLS] + b, W row-major in the packed dtype, float32 result."""
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, COLS)
    w = tl.load(w_ptr + rows * COLS + cols[None, :])
    acc = tl.dot(x.to(w.dtype), w, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    return acc + tl.load(b_ptr + cols)[None, :]


@jit
def mlp_forward(x, w_in_ptr, b_in_ptr, w_hid_ptr, b_hid_ptr, w_out_ptr, b_out_ptr,
                HIDDEN: tl.constexpr, ACTS: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr,
                A_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, FAST: tl.constexpr):
    """MLP output [BLOCK, A_PAD] (float32) for inputs ``x`` [BLOCK, D_PAD] (float32)."""
    if HIDDEN == 0:
        h = x
    else:
        h = activate(dense(x, w_in_ptr, b_in_ptr, D_PAD, P, DOT_PRECISION), ACTS & 3, FAST)
        for layer in tl.static_range(1, HIDDEN):
            h = activate(dense(h, w_hid_ptr + (layer - 1) * P * P, b_hid_ptr + (layer - 1) * P, P, P, DOT_PRECISION),
                         (ACTS >> (2 * layer)) & 3, FAST)
    return dense(h, w_out_ptr, b_out_ptr, P, A_PAD, DOT_PRECISION)


@jit
def column(out, j, A_PAD: tl.constexpr):
    """``out[:, j]`` of a [BLOCK, A_PAD] tile."""
    col = tl.arange(0, A_PAD)[None, :]
    return tl.sum(tl.where(col == j, out, 0.0), axis=1)


@jit
def sample_categorical(logits, u, NUM_ACTIONS: tl.constexpr, A_PAD: tl.constexpr):
    """Inverse-CDF sample from ``logits`` [BLOCK, A_PAD] with uniforms ``u`` [BLOCK] in [0, 1).

    Returns (action as float32, log-probability).  Only the first NUM_ACTIONS columns count.
    Up to four actions the logits are taken out as vectors (one reduction each) and the CDF
    is summed left to right; more actions work on the tile (max, exp, scan, reductions).
    """
    if NUM_ACTIONS <= 4:
        l0 = column(logits, 0, A_PAD)
        l1 = column(logits, 1, A_PAD)
        l2 = l1
        l3 = l1
        peak = tl.maximum(l0, l1)
        if NUM_ACTIONS > 2:
            l2 = column(logits, 2, A_PAD)
            peak = tl.maximum(peak, l2)
        if NUM_ACTIONS > 3:
            l3 = column(logits, 3, A_PAD)
            peak = tl.maximum(peak, l3)
        cdf0 = tl.exp(l0 - peak)
        cdf1 = cdf0 + tl.exp(l1 - peak)
        total = cdf1
        cdf2 = cdf1
        if NUM_ACTIONS > 2:
            cdf2 = cdf1 + tl.exp(l2 - peak)
            total = cdf2
        if NUM_ACTIONS > 3:
            total = cdf2 + tl.exp(l3 - peak)
        target = u * total
        action = (cdf0 <= target).to(tl.int32)
        chosen = tl.where(cdf0 <= target, l1, l0)
        if NUM_ACTIONS > 2:
            action += (cdf1 <= target).to(tl.int32)
            chosen = tl.where(cdf1 <= target, l2, chosen)
        if NUM_ACTIONS > 3:
            action += (cdf2 <= target).to(tl.int32)
            chosen = tl.where(cdf2 <= target, l3, chosen)
    else:
        col = tl.arange(0, A_PAD)[None, :]
        valid = col < NUM_ACTIONS
        logits = tl.where(valid, logits, float("-inf"))
        peak = tl.max(logits, axis=1)
        weights = tl.exp(logits - peak[:, None])  # 0 in the padded columns
        cdf = tl.cumsum(weights, axis=1)
        total = tl.sum(tl.where(col == NUM_ACTIONS - 1, cdf, 0.0), axis=1)
        target = u * total
        # the last action takes whatever rounding leaves above F_{n-2}
        below = (col < NUM_ACTIONS - 1) & (cdf <= target[:, None])
        action = tl.sum(below.to(tl.int32), axis=1)
        chosen = tl.sum(tl.where(col == action[:, None], logits, 0.0), axis=1)
    return action.to(tl.float32), chosen - peak - tl.log(total)


@jit
def sample_gaussian(out, log_std, z, A_PAD: tl.constexpr):
    """Gaussian sample with mean ``out[:, 0]`` and std exp(log_std); returns (action, log-prob)."""
    action = column(out, 0, A_PAD) + tl.exp(log_std) * z
    return action, -0.5 * z * z - log_std - HALF_LOG_TWO_PI


