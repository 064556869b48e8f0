"""strata: very large Mixture-of-Experts language models on one GPU plus the host."""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from strata.devices import Device, device_count, devices
from strata.errors import CudaError, FormatError, InvalidArgument, OutOfMemory, StrataError
from strata.options import KV, Mode

try:
    __version__ = version("strata-moe")  # the distribution name (pyproject.toml)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

# load / Model pull in the file, quant and loader modules: imported on first use, so `import strata`
# stays light (doctor, errors, devices).
_LAZY = {"load": "strata.api", "ReferenceModel": "strata.api", "Model": "strata.runtime.model",
         "ModelInfo": "strata.runtime.model", "Session": "strata.generation", "Completion": "strata.generation",
         "Piece": "strata.generation", "Graphs": "strata.runtime.engine"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "KV",
    "Completion",
    "CudaError",
    "Device",
    "FormatError",
    "Graphs",
    "InvalidArgument",
    "Model",
    "ModelInfo",
    "Mode",
    "OutOfMemory",
    "Piece",
    "ReferenceModel",
    "Session",
    "StrataError",
    "device_count",
    "devices",
    "load",
]
