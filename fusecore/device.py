"""Device facts for grid sizing and roofline accounting.

:func:`device_facts` reads what the driver reports (multiprocessor count, L2 size, shared
memory per block) and joins it with :data:`PEAKS`, a small table of the memory bandwidth
and matrix throughput each GPU model reaches.  Figures measured on our own machines are
marked ``measured`` and preferred; the rest are vendor datasheet figures, marked as such,
so a roofline fraction always says what it was computed against.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import asdict, dataclass, field

import torch

# Registers of the sm_80 .. sm_100 multiprocessors (CUDA programming guide, compute capability table): 64 K
# 32-bit registers each, allocated per warp in units of 256 (8 a thread); at most 255 a thread.
REGISTERS_PER_SM = 65536
REGISTER_ALLOCATION_UNIT = 256
MAX_REGISTERS_PER_THREAD = 255


def register_cap(num_warps: int, programs_per_sm: int) -> int:
    """The most registers a thread may hold (ptxas ``maxnreg``) for ``programs_per_sm`` programs of ``num_warps``
    warps to be resident on one multiprocessor together: a launch sized for that many programs per multiprocessor
    runs in one wave only if the compiler stays under it (``fusecore.compile_check`` reports what it allots)."""
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (num_warps, programs_per_sm)):
        raise ValueError(f"register_cap: num_warps and programs_per_sm must be ints >= 1, got {num_warps!r}, "
                         f"{programs_per_sm!r}")
    per_warp = REGISTERS_PER_SM // (num_warps * programs_per_sm) // REGISTER_ALLOCATION_UNIT * REGISTER_ALLOCATION_UNIT
    if per_warp == 0:
        raise ValueError(f"register_cap: {programs_per_sm} programs of {num_warps} warps exceed one multiprocessor's "
                         f"{REGISTERS_PER_SM} registers")
    return min(MAX_REGISTERS_PER_THREAD, per_warp // 32)


@dataclass(frozen=True)
class Peak:
    """Peak rates of one GPU model: bytes/s (read + written) and FLOP/s per dtype."""

    bandwidth: float
    flops: dict[str, float]
    source: str


# Keys are matched against torch.cuda.get_device_name() as case-insensitive whole words (no letter or digit
# either side: "GH200" is not an "H200"), in order, so the more specific names come first.
PEAKS: dict[str, Peak] = {
    "H200": Peak(
        bandwidth=4.28e12,
        flops={"bfloat16": 786e12, "float16": 786e12, "tf32": 494e12, "float32": 67e12},
        source="measured: H200 device-to-device copy 4.28 TB/s, bf16 8192^3 matmul 786 TFLOP/s; "
        "fp32/tf32 datasheet (SXM, dense)",
    ),
    "H100 80GB HBM3": Peak(
        bandwidth=3.0e12,
        flops={"bfloat16": 798e12, "float16": 798e12, "tf32": 494e12, "float32": 67e12},
        source="measured: H100 SXM device-to-device copy ~3.0 TB/s, bf16 8192^3 matmul 798 TFLOP/s; "
        "fp32/tf32 datasheet (SXM, dense)",
    ),
    "H100 PCIe": Peak(
        bandwidth=2.0e12,
        flops={"bfloat16": 756e12, "float16": 756e12, "tf32": 378e12, "float32": 51e12},
        source="datasheet",
    ),
    "H100": Peak(
        bandwidth=3.35e12,
        flops={"bfloat16": 989e12, "float16": 989e12, "tf32": 494e12, "float32": 67e12},
        source="datasheet",
    ),
    "A100-SXM4-80GB": Peak(
        bandwidth=2.04e12,
        flops={"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
        source="datasheet",
    ),
    "A100": Peak(
        bandwidth=1.555e12,
        flops={"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
        source="datasheet",
    ),
    "L40S": Peak(
        bandwidth=0.864e12,
        flops={"bfloat16": 362e12, "float16": 362e12, "tf32": 183e12, "float32": 91.6e12},
        source="datasheet",
    ),
    "L4": Peak(
        bandwidth=0.3e12,
        flops={"bfloat16": 121e12, "float16": 121e12, "tf32": 60e12, "float32": 30e12},
        source="datasheet",
    ),
    "RTX 4090": Peak(
        bandwidth=1.008e12,
        flops={"bfloat16": 165e12, "float16": 165e12, "tf32": 82.6e12, "float32": 82.6e12},
        source="datasheet",
    ),
}


@dataclass(frozen=True)
class DeviceFacts:
    """What the kernels and the roofline need to know about one device."""

    name: str
    kind: str  # "cuda" or "cpu"
    sm_count: int  # multiprocessors (CPU: cores), the unit persistent grids are sized by
    l2_bytes: int
    smem_per_block_bytes: int
    capability: tuple[int, int] | None
    peak: Peak | None = field(default=None)

    @property
    def bandwidth(self) -> float | None:
        return self.peak.bandwidth if self.peak else None

    def flops(self, dtype: str | torch.dtype) -> float | None:
        if self.peak is None:
            return None
        key = str(dtype).replace("torch.", "")
        return self.peak.flops.get(key)

    def as_dict(self) -> dict:
        return asdict(self)


def names_model(name: str, key: str) -> bool:
    """Whether device name ``name`` names model ``key``: case-insensitive, ``key`` as whole words (no letter or
    digit either side, so "NVIDIA GH200 480GB" does not name an "H200")."""
    return re.search(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])", name.lower()) is not None


def lookup_peak(name: str) -> Peak | None:
    for key, peak in PEAKS.items():
        if names_model(name, key):
            return peak
    return None


@functools.cache
def _cuda_facts(index: int) -> DeviceFacts:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    return DeviceFacts(
        name=props.name,
        kind="cuda",
        sm_count=props.multi_processor_count,
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
        smem_per_block_bytes=int(smem),
        capability=(props.major, props.minor),
        peak=lookup_peak(props.name),
    )


@functools.cache
def _cpu_facts() -> DeviceFacts:
    name = platform.processor() or platform.machine() or "cpu"
    return DeviceFacts(
        name=f"cpu ({name}, Triton interpreter)",
        kind="cpu",
        sm_count=os.cpu_count() or 1,
        l2_bytes=0,
        smem_per_block_bytes=0,
        capability=None,
        peak=None,
    )


def device_facts(device: torch.device | str | int | None = None) -> DeviceFacts:
    """Facts of ``device`` (default: the current CUDA device, or the CPU without one)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    if isinstance(device, bool):  # an int to Python: True would name CUDA device 1
        raise TypeError(f"device_facts: device must be a torch.device, a str, an int or None, got {device!r}")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device_facts: '{device}' was asked for, but CUDA is not available on this machine")
        count = torch.cuda.device_count()
        index = device.index if device.index is not None else torch.cuda.current_device()
        if not 0 <= index < count:
            raise ValueError(f"device_facts: '{device}' does not exist; this machine has {count} CUDA device(s)")
        return _cuda_facts(index)
    if device.type == "cpu":
        return _cpu_facts()
    raise ValueError(f"device must be 'cuda' or 'cpu', got '{device}'")
