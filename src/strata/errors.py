"""The exceptions strata raises. Every error from the native core arrives as one of these."""


class StrataError(Exception):
    """Base of every error strata raises on purpose."""


class FormatError(StrataError):
    """A model file is malformed, truncated, or not what its architecture requires."""


class InvalidArgument(StrataError, ValueError):
    """An argument or a size is impossible (names the argument and the limit)."""


class OutOfMemory(StrataError, MemoryError):
    """GPU or host memory could not hold what was asked for."""


class CudaError(StrataError, RuntimeError):
    """A CUDA runtime call failed; ``cuda_name`` is the CUDA error name (e.g. ``cudaErrorInvalidValue``)."""

    def __init__(self, message: str, cuda_name: str = ""):
        super().__init__(message)
        self.cuda_name = cuda_name


__all__ = ["StrataError", "FormatError", "InvalidArgument", "OutOfMemory", "CudaError"]
