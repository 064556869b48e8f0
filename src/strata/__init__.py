"""strata: very large Mixture-of-Experts language models on one GPU plus the host."""

from strata.errors import CudaError, FormatError, InvalidArgument, OutOfMemory, StrataError

__all__ = ["StrataError", "FormatError", "InvalidArgument", "OutOfMemory", "CudaError"]
