"""Device discovery: no exception without a GPU, correct descriptions with one."""

import pytest

import strata
from strata import _native


def test_device_count_is_a_non_negative_int_without_raising():
    count = _native.device_count()
    assert isinstance(count, int) and count >= 0
    assert strata.device_count() == count
    assert len(strata.devices()) == count


def test_device_info_out_of_range_names_the_index():
    count = _native.device_count()
    with pytest.raises(strata.InvalidArgument, match=f"device index {count + 3} out of range"):
        _native.device_info(count + 3)


def test_runtime_version_is_built_in():
    assert _native.runtime_version() >= 12000


@pytest.mark.gpu
def test_devices_describe_each_gpu():
    for device in strata.devices():
        assert device.name
        assert device.compute_capability >= (8, 0)
        assert device.total_memory >= device.free_memory > 0
        assert device.sm_count > 0
    assert _native.driver_version() >= _native.runtime_version() // 1000 * 1000
