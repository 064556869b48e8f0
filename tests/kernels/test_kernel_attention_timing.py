"""The decode attention timing hooks benchmarks/bench_attention.py runs: their argument checks (before any device
is touched) and, on the GPU, that they time something."""

import pytest

import strata

pytestmark = pytest.mark.hooks


def test_attention_timing_refuses_impossible_sizes():
    from strata import _native_check

    with pytest.raises(strata.InvalidArgument, match="time_attention_decode: need context > 0"):
        _native_check.time_attention_decode(heads=24, kv_heads=2, head_dim=256, context=0)
    with pytest.raises(strata.InvalidArgument, match="does not take 24 q heads over 5 kv heads of 256"):
        _native_check.time_attention_decode(heads=24, kv_heads=5, head_dim=256, context=24)
    with pytest.raises(strata.InvalidArgument, match="time_qsa_select: need .* got 24, 4, 4, 512, 100"):
        _native_check.time_qsa_select(heads=4, head_dim=100, context=24, keep_blocks=512)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8", "q4", "k8v4"])
def test_attention_timings_time_the_kernels(kv):
    from strata import _native_check

    seconds = _native_check.time_attention_decode(heads=24, kv_heads=2, head_dim=256, kv=kv, context=3000,
                                                  keep_blocks=512, reps=5)
    assert 0.0 < seconds < 1e-2
    for top_only in (False, True):
        seconds = _native_check.time_qsa_select(heads=4, head_dim=128, context=3000, keep_blocks=512,
                                                top_only=top_only, reps=5)
        assert 0.0 < seconds < 1e-2
