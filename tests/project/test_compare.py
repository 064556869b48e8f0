"""support.compare, the comparisons every test makes: what passes, what fails, and what its messages name."""

import numpy as np
import pytest

from support.compare import assert_same_bits, relative_error, relative_errors


def test_same_bits_passes_equal_arrays_of_any_layout(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    assert_same_bits(x, x.copy(), "copy")
    assert_same_bits(x.T, np.array(x.T, order="C"), "a transposed view")


def test_same_bits_names_what_differs_where(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = x.copy()
    y[2, 1] = np.nextafter(y[2, 1], np.float32(np.inf))  # one ulp
    with pytest.raises(AssertionError, match=r"^rows: 1 of 15 elements differ in rows \[2\], first at \(2, 1\)"):
        assert_same_bits(y, x, "rows")
    with pytest.raises(AssertionError, match="differ"):
        assert_same_bits(np.float32([-0.0]), np.float32([0.0]), "signed zeros")  # equal as floats, not as bits


def test_same_bits_refuses_other_dtypes_and_shapes():
    with pytest.raises(AssertionError, match="dtypes float64 and float32, not float32"):
        assert_same_bits(np.zeros(3), np.zeros(3, np.float32), "dtype")
    with pytest.raises(AssertionError, match=r"shape \(3,\) != \(4,\)"):
        assert_same_bits(np.zeros(3, np.float32), np.zeros(4, np.float32), "shape")
    assert_same_bits(np.ones(3, np.float16), np.ones(3, np.float16), "half", dtype=np.float16)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_never_passes_even_against_the_same_bits(bad):
    x = np.float32([1.0, bad])
    with pytest.raises(AssertionError, match=r"result: 1 of 2 elements are NaN or infinite, first at \(1,\)"):
        assert_same_bits(x, np.float32([1.0, 2.0]), "result")
    with pytest.raises(AssertionError, match="the oracle: 1 of 2"):
        assert_same_bits(np.float32([1.0, 2.0]), x, "result")
    with pytest.raises(AssertionError, match="NaN or infinite"):
        assert_same_bits(x, x.copy(), "result")
    with pytest.raises(AssertionError, match="NaN or infinite"):
        relative_error(x, np.float32([1.0, 2.0]))


def test_infinities_pass_where_the_caller_allows_them_and_nan_still_fails():
    x = np.float32([1.0, np.inf, -np.inf])
    assert_same_bits(x, x.copy(), "overflow", infinities=True)
    with pytest.raises(AssertionError, match=r"overflow: 1 of 3 elements are NaN, first at \(0,\)"):
        assert_same_bits(np.float32([np.nan, np.inf, 1.0]), x, "overflow", infinities=True)


def test_poisoned_cells_compare_as_bits():
    poison = np.float32([np.nan, 1.0])
    assert_same_bits(poison, poison.copy(), "cache", poisoned=True)
    other = poison.view(np.uint32).copy()
    other[0] ^= 1  # another NaN
    with pytest.raises(AssertionError, match="cache: 1 of 2 elements differ"):
        assert_same_bits(other.view(np.float32), poison, "cache", poisoned=True)


def test_relative_error_is_on_the_oracles_largest_magnitude(rng):
    want = rng.standard_normal(50)
    got = want.copy()
    got[7] += 1e-3
    assert relative_error(got, want) == pytest.approx(1e-3 / np.max(np.abs(want)), rel=1e-9)
    assert relative_error(want.astype(np.float32), want) < 1e-7
    with pytest.raises(AssertionError, match="all zeros"):
        relative_error(np.zeros(3), np.zeros(3))


def test_relative_errors_are_per_row(rng):
    want = rng.standard_normal((4, 10))
    got = want.copy()
    got[2] *= 1.01
    errors = relative_errors(got, want)
    assert errors.shape == (4,) and np.count_nonzero(errors) == 1 and errors[2] == pytest.approx(0.01, rel=1e-9)
    assert relative_errors(list(got), list(want)).tolist() == errors.tolist()
    with pytest.raises(AssertionError, match="3 results against 4 oracles"):
        relative_errors(got[:3], want)
