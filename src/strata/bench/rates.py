"""What this machine moves, measured here: the rates a decoded token's limit divides its bytes by."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from strata.errors import InvalidArgument

READ_BANDWIDTH_BYTES = 1 << 30  # buffer the pool's workers read to measure host read bandwidth
UPLOAD_BYTES = 256 << 20  # pinned host buffer copied to the GPU
DEVICE_COPY_BYTES = 256 << 20  # each of the two VRAM buffers of the device copy: far past the L2, within the reserve
DOORBELL_ROUNDS = 1000

_WHAT = {"host_read": ("host read bandwidth", "bytes/s"), "pcie_upload": ("pinned host -> device copy rate", "bytes/s"),
         "hbm_copy": ("HBM traffic rate of a device copy", "bytes/s"), "doorbell_round_trip": ("doorbell round trip", "s")}


@dataclass(frozen=True)
class Rates:
    """The machine's rates; each is refused unless > 0 and finite."""

    host_read: float  # bytes/s the CPU pool's workers read from host RAM
    pcie_upload: float  # bytes/s of page-locked host -> device copies
    hbm_copy: float  # bytes/s of HBM traffic of a device -> device copy (each byte read and written)
    doorbell_round_trip: float  # seconds: the GPU rings through mapped memory, the host answers, the GPU sees it

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not (math.isfinite(value) and value > 0):
                what, unit = _WHAT[field.name]
                raise InvalidArgument(f"{what} must be > 0 {unit} and finite, got {value}")


def measure(pool: Any, device: int) -> Rates:
    """The rates of this machine: host read by `pool`'s workers (a strata.runtime.pool.ExpertPool), and the
    PCIe upload, HBM copy and doorbell round trip of GPU `device`."""
    from strata import _native

    return Rates(host_read=pool.read_bandwidth(READ_BANDWIDTH_BYTES),
                 pcie_upload=_native.pinned_upload_rate(device, UPLOAD_BYTES),
                 hbm_copy=_native.device_copy_rate(device, DEVICE_COPY_BYTES),
                 doorbell_round_trip=_native.doorbell_round_trip(device, DOORBELL_ROUNDS))

