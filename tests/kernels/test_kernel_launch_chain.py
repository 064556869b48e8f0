"""Kernels launched through strata's launch (cuda/src/kernels/launch.cuh: programmatic dependent launch from
sm_90) keep stream order: a chain of kernels, each adding one to what the kernel before it wrote after a spin
that a kernel launched early and not waiting would overlap, counts every link on an owned stream, on the legacy
default stream (the kernel checks') and in a captured graph."""

import numpy as np
import pytest

from strata.errors import InvalidArgument
from support.hooks import native_check as _native_check

pytestmark = pytest.mark.hooks


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["owned", "legacy", "captured"])
@pytest.mark.parametrize(("links", "cells", "spin_ns"), [
    (16, 64 * 128, 20_000),  # 64 CTAs, all resident at once: an early link would overlap its predecessor's spin
    (8, 1 << 20, 1_000),     # 8192 CTAs, many waves: the next link launches as the last wave starts
])
def test_every_link_sees_the_one_before(where, links, cells, spin_ns):
    counters = _native_check.launch_chain(where, links=links, cells=cells, spin_ns=spin_ns)
    assert counters.shape == (cells,)
    short = np.flatnonzero(counters != links)
    assert short.size == 0, f"{short.size} of {cells} counters are not {links}: first {counters[short[:8]]}"


def test_launch_chain_names_a_bad_stream():
    with pytest.raises(InvalidArgument, match="where must be one of"):
        _native_check.launch_chain("default", links=1, cells=1, spin_ns=0)
