"""Policies evaluated inside the rollout kernel: an MLP and its action heads.

MLP (weights zero-padded on the host, see :mod:`simfuse.policy`), for an observation tile
``x`` [BLOCK, D_PAD]::

    h1  = act(x W_in + b_in)                       W_in  [D_PAD, H_PAD]
    h2  = act(h1 W_hid + b_hid)   (TWO_HIDDEN)     W_hid [H_PAD, H_PAD]
    out = h W_out + b_out                          W_out [H_PAD, A_PAD]

with act = tanh (ACTIVATION 0) or ReLU (1).  PRECISION "ieee" computes the products in
float32 on the CUDA cores (log-probabilities agree with PyTorch's float32 forward to ~1e-6);
"tf32" uses the tensor cores (about 8x the throughput, products rounded to 10-bit
mantissas: log-probabilities within ~1e-3).  Heads:

* categorical (discrete, n <= 4 actions): log π(a) = out_a − logsumexp(out); the action is
  sampled by the Gumbel-max trick, a = argmax_a(out_a − log(−log u_a)), with the four
  Philox uniforms of the step;
* Gaussian (continuous, one dimension): a = μ + σ z with z the Philox normal of the step,
  log π(a) = −z²/2 − log σ − log(2π)/2.

Weights are read from L1/L2 every step (24 KiB per 2x64 MLP and program; keeping them in
registers for the whole loop spills): an MLP policy adds no device-memory traffic per step
beyond the log-probability (and value) it writes.
"""

import triton.language as tl

from fusecore.backend import jit

HALF_LOG_TWO_PI: tl.constexpr = tl.constexpr(0.9189385332046727)


@jit
def activate(x, ACTIVATION: tl.constexpr, FAST: tl.constexpr):
    """tanh (ACTIVATION == 0) or ReLU.

    Exact mode: tanh from exp(-2|x|), accurate to float32 rounding for every x (no
    cancellation near 0).  FAST (with TF32 products, whose rounding is larger anyway):
    1 - 2 / (exp(2x) + 1), fewer instructions, absolute error ~1e-7, saturating to ±1.
    """
    if ACTIVATION == 0:
        if FAST:
            y = 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
        else:
            e = tl.exp(-2.0 * tl.abs(x))
            t = (1.0 - e) / (1.0 + e)
            y = tl.where(x >= 0.0, t, -t)
    else:
        y = tl.maximum(x, 0.0)
    return y


@jit
def load_matrix(ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """A row-major [ROWS, COLS] float32 matrix (already padded on the host)."""
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, COLS)[None, :]
    return tl.load(ptr + rows * COLS + cols)


@jit
def load_mlp(w_in_ptr, b_in_ptr, w_hid_ptr, b_hid_ptr, w_out_ptr, b_out_ptr,
             D_PAD: tl.constexpr, H_PAD: tl.constexpr, A_PAD: tl.constexpr):
    """All weights of one packed MLP as register tiles: (W_in, b_in, W_hid, b_hid, W_out, b_out)."""
    return (load_matrix(w_in_ptr, D_PAD, H_PAD), tl.load(b_in_ptr + tl.arange(0, H_PAD)),
            load_matrix(w_hid_ptr, H_PAD, H_PAD), tl.load(b_hid_ptr + tl.arange(0, H_PAD)),
            load_matrix(w_out_ptr, H_PAD, A_PAD), tl.load(b_out_ptr + tl.arange(0, A_PAD)))


@jit
def mlp_forward(x, w_in, b_in, w_hid, b_hid, w_out, b_out, TWO_HIDDEN: tl.constexpr, ACTIVATION: tl.constexpr,
                PRECISION: tl.constexpr):
    """MLP output [BLOCK, A_PAD] for inputs ``x`` [BLOCK, D_PAD] (weights as loaded tiles)."""
    h = activate(tl.dot(x, w_in, input_precision=PRECISION) + b_in[None, :], ACTIVATION, PRECISION == "tf32")
    if TWO_HIDDEN:
        h = activate(tl.dot(h, w_hid, input_precision=PRECISION) + b_hid[None, :], ACTIVATION, PRECISION == "tf32")
    return tl.dot(h, w_out, input_precision=PRECISION) + b_out[None, :]


@jit
def sample_categorical(logits, u0, u1, u2, u3, NUM_ACTIONS: tl.constexpr, A_PAD: tl.constexpr):
    """Gumbel-max sample from ``logits`` [BLOCK, A_PAD]; returns (action as float32, log-prob)."""
    col = tl.arange(0, A_PAD)[None, :]
    valid = col < NUM_ACTIONS
    logits = tl.where(valid, logits, float("-inf"))
    peak = tl.max(logits, axis=1)
    lse = peak + tl.log(tl.sum(tl.exp(logits - peak[:, None]), axis=1))
    u = tl.where(col == 0, u0[:, None], tl.where(col == 1, u1[:, None], tl.where(col == 2, u2[:, None], u3[:, None])))
    # u in [0, 1): u = 0 gives a Gumbel of -inf (never chosen), never NaN.
    gumbel = -tl.log(-tl.log(u))
    perturbed = tl.where(valid, logits + gumbel, float("-inf"))
    action = tl.argmax(perturbed, axis=1)
    chosen = tl.sum(tl.where(col == action[:, None], logits, 0.0), axis=1)
    return action.to(tl.float32), chosen - lse


@jit
def sample_gaussian(out, log_std, z, A_PAD: tl.constexpr):
    """Gaussian sample with mean ``out[:, 0]`` and std exp(log_std); returns (action, log-prob)."""
    col = tl.arange(0, A_PAD)[None, :]
    mean = tl.sum(tl.where(col == 0, out, 0.0), axis=1)
    action = mean + tl.exp(log_std) * z
    return action, -0.5 * z * z - log_std - HALF_LOG_TWO_PI


@jit
def first_column(out, A_PAD: tl.constexpr):
    """``out[:, 0]`` of a [BLOCK, A_PAD] tile (the value head's output)."""
    col = tl.arange(0, A_PAD)[None, :]
    return tl.sum(tl.where(col == 0, out, 0.0), axis=1)
