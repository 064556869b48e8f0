"""Every C++ error kind arrives in Python as the right strata exception, with its message."""

import pytest

import strata
from support.hooks import native_check as _native_check


@pytest.mark.parametrize(
    ("kind", "exception", "compatible", "fragment"),
    [
        ("invalid_argument", strata.InvalidArgument, ValueError, "test: invalid argument"),
        ("out_of_memory", strata.OutOfMemory, MemoryError, "test: out of memory"),
        ("format", strata.FormatError, strata.StrataError, "test: format error"),
        ("cuda", strata.CudaError, RuntimeError, "cudaErrorInvalidValue"),
        ("error", strata.StrataError, Exception, "test: generic error"),
    ],
)
@pytest.mark.hooks
def test_native_errors_map_to_python_classes(kind, exception, compatible, fragment):
    with pytest.raises(exception, match=fragment) as caught:
        _native_check.raise_error(kind)
    assert type(caught.value) is exception
    assert isinstance(caught.value, compatible)
    assert isinstance(caught.value, strata.StrataError)


@pytest.mark.hooks
def test_cuda_error_carries_the_cuda_error_name():
    with pytest.raises(strata.CudaError) as caught:
        _native_check.raise_error("cuda")
    assert caught.value.cuda_name == "cudaErrorInvalidValue"
    # The message says which call failed and where, not only the code.
    assert "failed" in str(caught.value) and "kernel_check" in str(caught.value)


@pytest.mark.hooks
def test_unknown_kind_is_an_invalid_argument_naming_it():
    with pytest.raises(strata.InvalidArgument, match="unknown kind 'bogus'"):
        _native_check.raise_error("bogus")


def test_exception_hierarchy_is_catchable_by_builtin_classes():
    assert issubclass(strata.InvalidArgument, ValueError)
    assert issubclass(strata.OutOfMemory, MemoryError)
    assert issubclass(strata.CudaError, RuntimeError)
    assert not issubclass(strata.FormatError, ValueError)
