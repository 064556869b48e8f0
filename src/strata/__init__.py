"""strata: very large Mixture-of-Experts language models on one GPU plus the host."""

from strata.devices import Device, device_count, devices
from strata.errors import CudaError, FormatError, InvalidArgument, OutOfMemory, StrataError

__all__ = [
    "CudaError",
    "Device",
    "FormatError",
    "InvalidArgument",
    "OutOfMemory",
    "StrataError",
    "device_count",
    "devices",
]
