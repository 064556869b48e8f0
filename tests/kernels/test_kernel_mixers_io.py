"""Embedding row gather and the doorbell (publish -> host thread -> device wait) on the GPU."""

import numpy as np
import pytest

pytestmark = pytest.mark.hooks


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_embed_rows_exact(rng, kind):
    from strata import _native_check

    rows, cols = 50, 320
    values = rng.standard_normal((rows, cols), dtype=np.float32)
    ids = rng.integers(0, rows, 17).astype(np.int32)
    d = None
    if kind == "f32":
        table, want = values, values
    elif kind == "f16":
        table = values.astype(np.float16)
        want = table.astype(np.float32)
    elif kind == "bf16":
        table = bf16_bits(values)
        want = (table.astype(np.uint32) << 16).view(np.float32)
    else:
        table = rng.integers(0, 256, (rows, cols)).astype(np.uint8)
        d = rng.uniform(0.001, 0.1, (rows, cols // 32)).astype(np.float16)
        want = (np.repeat(d.astype(np.float32), 32, axis=1) * (table.astype(np.float32) - 128)).astype(np.float32)
    got = _native_check.embed_rows(table, ids, d=d)
    # Each element is one conversion (and for Q8_0 one float32 product), done identically here: exact.
    assert np.array_equal(got, want[ids]), f"kind={kind}"


@pytest.mark.gpu
def test_embed_rows_bad_id_gives_nan_row(rng):
    from strata import _native_check

    table = rng.standard_normal((8, 64), dtype=np.float32)
    got = _native_check.embed_rows(table, np.array([3, 8, -1], np.int32))
    assert np.array_equal(got[0], table[3])
    assert np.all(np.isnan(got[1:]))


@pytest.mark.gpu
def test_doorbell_round_trip_with_host_thread(rng):
    from strata import _native_check

    n, k = 2560, 8
    x = rng.standard_normal(n, dtype=np.float32)
    ids = rng.integers(0, 512, k).astype(np.int32)
    weights = rng.uniform(0.0, 1.0, k).astype(np.float32)
    answer = rng.standard_normal(n, dtype=np.float32)
    base, offset = int(rng.integers(1, 10_000)), 7
    got = _native_check.doorbell_round_trip(x, ids, weights, base, offset, answer)
    assert got["status"] == 0
    assert got["seq_seen"] == base + offset
    assert np.array_equal(got["published_x"], x)
    assert np.array_equal(got["published_ids"], ids)
    assert np.array_equal(got["published_weights"], weights)
    assert np.array_equal(got["answered"], answer)


@pytest.mark.gpu
def test_doorbell_wait_times_out_with_a_status(rng):
    from strata import _native_check

    n, k = 256, 4
    x = rng.standard_normal(n, dtype=np.float32)
    base, offset = int(rng.integers(1, 10_000)), 3
    got = _native_check.doorbell_round_trip(x, np.arange(k, dtype=np.int32), np.ones(k, np.float32), base, offset,
                                      None, timeout_ns=20_000)
    assert got["status"] == offset  # the layer offset of the ring never answered (a ring may be 0 once wrapped)
    assert got["seq_seen"] == base + offset  # the publish still reached the host
    assert np.array_equal(got["published_x"], x)
    assert np.all(np.isnan(got["answered"]))  # nothing copied: the poisoned output is untouched
