"""fusecore: the shared Triton kernel-building core of fusekit.

Importing fusecore fixes the kernel mode (compiled on a CUDA GPU, Triton interpreter on the
CPU) before any kernel is defined; see :mod:`fusecore.backend`.
"""

from . import backend, testing
from .backend import (
    COMPILED,
    INTERPRET,
    KERNEL_MODE,
    BackendError,
    autotune,
    check_devices,
    check_dtypes,
    default_device,
    jit,
    reference_enabled,
    set_reference,
    use_reference,
)
from .device import DeviceFacts, device_facts
from .plan import PlanCache, WorkPlan, cdiv, make_work_plan, next_power_of_2, persistent_grid, tensor_signature
from .report import Record, environment, floor_ms, format_table, read_jsonl, set_speedups, write_jsonl
from .rng import DevicePhiloxStream, PhiloxStream
from .timing import Timing, host_probe_us, measure, peak_memory

__all__ = [
    "backend", "testing", "COMPILED", "INTERPRET", "KERNEL_MODE", "BackendError", "autotune",
    "check_devices", "check_dtypes",
    "default_device", "jit", "reference_enabled", "set_reference", "use_reference",
    "DeviceFacts", "device_facts", "PlanCache", "WorkPlan", "cdiv", "make_work_plan", "next_power_of_2",
    "persistent_grid", "tensor_signature", "Record", "environment", "floor_ms", "format_table",
    "read_jsonl", "set_speedups", "write_jsonl", "DevicePhiloxStream", "PhiloxStream", "Timing", "host_probe_us",
    "measure", "peak_memory",
]
__version__ = "0.1.0"
