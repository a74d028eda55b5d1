"""Counter-based random numbers: Philox-4x32-10, identical compiled and interpreted.

Convention (one for the whole project)
--------------------------------------
A random number is a pure function of ``(seed, stream, position)``:

* ``seed``     — a 64-bit key chosen on the host (``0 <= seed < 2**63``);
* ``stream``   — which element draws (an env id, an edge id, an element index), int64;
* ``position`` — how many draws that element made before (a step number), int64.

The Philox counter is ``(lo32(stream), hi32(stream), lo32(position), hi32(position))`` and
the key is ``(lo32(seed), hi32(seed))``; one call yields four independent 32-bit words.
Kernels never keep generator state: a host-side :class:`PhiloxStream` hands each launch a
``(seed, offset)`` pair and advances its offset by the number of positions the launch used,
so consecutive launches never reuse numbers and a launch can be replayed exactly (the
backward pass of dropout regenerates its mask this way instead of storing it).  Launches
captured in a CUDA graph take their pair from a :class:`DevicePhiloxStream` instead: the
pair lives in device memory and the graph itself advances the offset on every replay.

Because the generator is integer arithmetic only, the compiled kernel, the interpreter and
the numpy oracle :func:`philox_reference` give bit-identical words and uniforms.  Normal
deviates go through ``log``/``cos``/``sin`` and agree to a few float32 ulps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton.language as tl  # noqa: E402  (after backend: the kernel mode is fixed first)

from .backend import is_int, jit, triton  # noqa: F401  (triton re-exported for kernels' tl import order)

TWO_POW_M24 = 1.0 / (1 << 24)
TWO_PI = 2.0 * math.pi
_MASK32 = 0xFFFFFFFF


@jit
def philox_words(seed, stream, position):
    """Four uint32 Philox-4x32-10 words for counter (stream, position) under key ``seed``."""
    stream = stream.to(tl.int64)
    position = position.to(tl.int64)
    c0 = (stream & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((stream >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = (position & 0xFFFFFFFF).to(tl.uint32)
    c3 = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return tl.philox(seed, c0, c1, c2, c3)


@jit
def word_to_uniform(word):
    """uint32 -> float32 uniform in [0, 1): the top 24 bits, exactly representable."""
    return (word >> 8).to(tl.float32) * 5.9604644775390625e-08


@jit
def word_to_open_uniform(word):
    """uint32 -> float32 uniform in (0, 1]: safe for log().  ``top + 0.5`` is rounded to float32 (24
    significant bits), so above ``2**23`` it is an even integer and the top word gives exactly 1.0 (a
    zero Box-Muller radius, once in 2**24 draws); :func:`normal_reference` rounds the same way."""
    return ((word >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08


@jit
def uniform4(seed, stream, position):
    """Four float32 uniforms in [0, 1) for (seed, stream, position)."""
    w0, w1, w2, w3 = philox_words(seed, stream, position)
    return word_to_uniform(w0), word_to_uniform(w1), word_to_uniform(w2), word_to_uniform(w3)


@jit
def normal4(seed, stream, position):
    """Four float32 standard normals for (seed, stream, position) by Box-Muller."""
    w0, w1, w2, w3 = philox_words(seed, stream, position)
    r0 = tl.sqrt(-2.0 * tl.log(word_to_open_uniform(w0)))
    r1 = tl.sqrt(-2.0 * tl.log(word_to_open_uniform(w2)))
    t0 = 6.283185307179586 * word_to_uniform(w1)
    t1 = 6.283185307179586 * word_to_uniform(w3)
    return r0 * tl.cos(t0), r0 * tl.sin(t0), r1 * tl.cos(t1), r1 * tl.sin(t1)


# ----------------------------------------------------------------------------- host side


def check_seed(seed: int) -> int:
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return seed


def check_position(name: str, value: int) -> int:
    """An offset or a count of positions: an int (numpy's too) in [0, 2**63), the range of the kernels' int64
    position arithmetic."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if not 0 <= value < 2**63:
        raise ValueError(f"{name} must be in [0, 2**63), got {value}")
    return value


@dataclass
class PhiloxStream:
    """Host-side owner of one ``(seed, offset)`` sequence.

    ``take(n)`` returns the ``(seed, offset)`` pair a launch passes to its kernel and
    advances the offset by ``n`` positions, so the next launch draws fresh numbers.
    """

    seed: int
    offset: int = 0

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        self.offset = check_position("offset", self.offset)

    def take(self, positions: int) -> tuple[int, int]:
        positions = check_position("positions", positions)
        if self.offset + positions >= 2**63:
            raise ValueError(f"taking {positions} positions at offset {self.offset} would pass 2**63: the stream "
                             "is used up (start another seed)")
        pair = (self.seed, self.offset)
        self.offset += positions
        return pair

    @classmethod
    def from_torch(cls) -> PhiloxStream:
        """A stream seeded from torch's default generator (respects ``torch.manual_seed``)."""
        return cls(int(torch.randint(0, 2**62, (1,)).item()))


@jit
def load_seed_pair(pair_ptr):
    """``(seed, offset)`` from the int64 pair a :class:`DevicePhiloxStream` handed a launch."""
    return tl.load(pair_ptr), tl.load(pair_ptr + 1)


@jit
def _take_kernel(state_ptr, pair_ptr, positions):
    # One program: copy the current (seed, offset) for this launch, then advance the offset.
    seed = tl.load(state_ptr)
    offset = tl.load(state_ptr + 1)
    tl.store(pair_ptr, seed)
    tl.store(pair_ptr + 1, offset)
    tl.store(state_ptr + 1, offset + positions)


class DevicePhiloxStream:
    """A ``(seed, offset)`` sequence kept in device memory, for launches captured in CUDA graphs.

    A :class:`PhiloxStream` hands kernels Python ints, which a CUDA graph freezes at capture:
    every replay would draw the same numbers (the same dropout mask, step after step).  Here the
    state is an int64 tensor ``[seed, offset]`` on the device; ``take(n)`` launches one tiny
    kernel that copies the current pair into a fresh int64 tensor of shape ``[2]`` (returned:
    the launch's kernel reads it with :func:`load_seed_pair`, and a backward pass that
    regenerates the numbers keeps it) and advances the device offset by ``n``.  Captured,
    that kernel is part of the graph, so each replay draws the next numbers, exactly the
    sequence a :class:`PhiloxStream` with the same seed hands out call by call.
    """

    def __init__(self, seed: int, device: torch.device | str, offset: int = 0):
        seed = check_seed(seed)
        offset = check_position("offset", offset)
        self.state = torch.tensor([seed, offset], dtype=torch.int64, device=device)

    @property
    def device(self) -> torch.device:
        return self.state.device

    def take(self, positions: int) -> torch.Tensor:
        """The ``(seed, offset)`` pair (int64 ``[2]`` on the device) for a launch using ``positions`` (< 2**62
        a launch; the device offset is not read back, so it would wrap only after 2**63 positions in all)."""
        positions = check_position("positions", positions)
        if positions >= 2**62:
            raise ValueError(f"positions must be < 2**62 a launch, got {positions}")
        pair = torch.empty(2, dtype=torch.int64, device=self.state.device)
        _take_kernel[(1,)](self.state, pair, positions)
        return pair

    @classmethod
    def from_torch(cls, device: torch.device | str) -> DevicePhiloxStream:
        """A stream seeded from torch's default generator (respects ``torch.manual_seed``)."""
        return cls(int(torch.randint(0, 2**62, (1,)).item()), device)


def _mulhilo(a: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    product = a.astype(np.uint64) * np.uint64(b)
    return (product >> np.uint64(32)) & np.uint64(_MASK32), product & np.uint64(_MASK32)


def philox_reference(seed: int, stream, position) -> np.ndarray:
    """Numpy oracle for :func:`philox_words`: uint32 array of shape ``broadcast + (4,)``."""
    seed = check_seed(seed)
    stream = np.asarray(stream, dtype=np.int64).astype(np.uint64)
    position = np.asarray(position, dtype=np.int64).astype(np.uint64)
    stream, position = np.broadcast_arrays(stream, position)
    m32 = np.uint64(_MASK32)
    return philox4x32(
        (stream & m32, (stream >> np.uint64(32)) & m32, position & m32, (position >> np.uint64(32)) & m32),
        (seed & _MASK32, (seed >> 32) & _MASK32),
    )


def philox4x32(counter, key, rounds: int = 10) -> np.ndarray:
    """Plain Philox-4x32 on numpy: counter = 4 arrays of uint32 words, key = 2 ints."""
    m32 = np.uint64(_MASK32)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, 0xD2511F53)
        hi1, lo1 = _mulhilo(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & m32
        k1 = (k1 + np.uint64(0xBB67AE85)) & m32
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def uniform_reference(seed: int, stream, position) -> np.ndarray:
    """Numpy oracle for :func:`uniform4`: float32 array ``broadcast + (4,)``, bit-identical."""
    words = philox_reference(seed, stream, position)
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(TWO_POW_M24)


def normal_reference(seed: int, stream, position) -> np.ndarray:
    """Float64 oracle for :func:`normal4` (the kernel agrees to float32 rounding)."""
    words = philox_reference(seed, stream, position).astype(np.float64)
    top = np.floor(words / 256.0)
    uniform = top * TWO_POW_M24
    open_uniform = (top + 0.5).astype(np.float32).astype(np.float64) * TWO_POW_M24  # as word_to_open_uniform
    r0 = np.sqrt(-2.0 * np.log(open_uniform[..., 0]))
    r1 = np.sqrt(-2.0 * np.log(open_uniform[..., 2]))
    t0 = TWO_PI * uniform[..., 1]
    t1 = TWO_PI * uniform[..., 3]
    return np.stack([r0 * np.cos(t0), r0 * np.sin(t0), r1 * np.cos(t1), r1 * np.sin(t1)], axis=-1)
