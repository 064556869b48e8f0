"""The CUDA devices strata can use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes
    free_memory: int  # bytes, when queried
    sm_count: int


def device_count() -> int:
    """Number of usable CUDA devices; 0 without a driver or a GPU."""
    from strata import _native

    return _native.device_count()


def devices() -> list[Device]:
    """Describes every CUDA device (empty without a driver or a GPU)."""
    from strata import _native

    return [Device(**_native.device_info(i)) for i in range(_native.device_count())]


def free_memory(device: int) -> int:
    """Free bytes on GPU `device` now; InvalidArgument for an index no device has."""
    from strata.errors import InvalidArgument

    gpus = devices()
    if not 0 <= device < len(gpus):
        raise InvalidArgument(f"device index {device} out of range: {len(gpus)} CUDA device(s) present")
    return gpus[device].free_memory


def cuda_version_text(version: int) -> str:
    """12040 -> '12.4'; 0 -> 'none'."""
    return f"{version // 1000}.{version % 1000 // 10}" if version else "none"
