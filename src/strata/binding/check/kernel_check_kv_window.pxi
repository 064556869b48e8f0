# The KV streaming window (strata::kernel_check, kernel_check_kv_window.hpp): claim, fill and reset over a host copy
# in mapped pinned memory, token by token through captured graphs. For tests only. Uses the mixer round trips'
# helpers and _chunk_bytes (kernel_check_mixers.pxi, kernel_check_attention_chunk.pxi, included before this file).
from strata.libstrata.check.kernel_check_kv_window cimport (
    KvWindowCheckOutputs, KvWindowCheckShape, KvWindowCheckSizes, KvWindowCheckTokens, cpp_kv_window_check_sizes,
    cpp_kv_window_steps,
)


cdef KvWindowCheckShape _kv_window_shape(kv, int n_head_kv, int head_dim, int ratio, int keep_blocks, int slots,
                                         int context, int n_head) except *:
    cdef KvWindowCheckShape shape
    shape.n_head_kv, shape.head_dim, shape.ratio, shape.keep_blocks = n_head_kv, head_dim, ratio, keep_blocks
    shape.slots, shape.context, shape.n_head, shape.kv = slots, context, n_head, kv_storage(kv)
    return shape


def kv_window_sizes(kv, *, int n_head_kv, int head_dim, int ratio, int keep_blocks, int slots, int context) -> dict:
    """Bytes of a window's pieces (kernel_check_kv_window.hpp, KvWindowCheckSizes): host_keys, host_values,
    window_keys, window_values (each half: codes, then scales), key_row, value_row (one token, every kv head),
    region (strata::kv_window_bytes) and slot (one block, strata::kv_window_slot_bytes)."""
    cdef KvWindowCheckShape shape = _kv_window_shape(kv, n_head_kv, head_dim, ratio, keep_blocks, slots, context, 0)
    cdef KvWindowCheckSizes s
    with nogil:
        s = cpp_kv_window_check_sizes(shape)
    return {"host_keys": s.host_keys, "host_values": s.host_values, "window_keys": s.window_keys,
            "window_values": s.window_values, "key_row": s.key_row, "value_row": s.value_row, "region": s.region,
            "slot": s.slot}


cdef unsigned char* _window_bytes(str name, arr, shape: tuple, list keep) except? NULL:
    """A private uint8 copy of arr, which must have `shape`, kept alive in `keep`."""
    _mixer_expect_shape(f"kv_window_steps {name}", arr, shape)
    return _chunk_bytes(np.array(arr, dtype=np.uint8, order="C").reshape(-1), keep)


cdef unsigned long long* _window_counters(arr, list keep) except? NULL:
    keep.append(arr)
    cdef unsigned long long[::1] v = arr
    return &v[0]


def kv_window_steps(host_keys, host_values, positions, selected, n_selected, resets, key_rows, value_rows, *, kv,
                    int n_head_kv, int head_dim, int ratio, int keep_blocks, int slots, int context, q=None,
                    q_gate=None, int device=0) -> dict:
    """Decoded tokens over a KV streaming window (kernel_check_kv_window.hpp, kv_window_steps).

    host_keys, host_values: the host copy's halves as stored (uint8, kv_window_sizes bytes). Per token t:
    positions [T], selected [T, keep_blocks] (the first n_selected[t] used: ascending complete blocks), resets [T]
    (reset the window first), key_rows [T, key_row], value_rows [T, value_row] (the row attention_prep would write:
    every kv head's codes, then their scales); optionally q [T, H, d] and q_gate [T, H, 2d] for attention_decode
    over the window and over a whole VRAM cache holding the same rows. Returns per token slot_of [T, blocks],
    owner, stamps [T, slots], fetched [T] (uint64), window_keys, window_values [T, bytes]; with q out_window,
    out_whole [T, H, d]; the host copy at the end (host_keys, host_values); and "reset": slot_of, owner, stamps,
    fetched after a last reset.
    """
    count = np.size(positions)
    heads = np.shape(q)[1] if q is not None else 0
    cdef KvWindowCheckShape shape = _kv_window_shape(kv, n_head_kv, head_dim, ratio, keep_blocks, slots, context,
                                                     heads)
    cdef KvWindowCheckSizes s = cpp_kv_window_check_sizes(shape)
    blocks = context // ratio
    keep = []
    cdef KvWindowCheckTokens tokens
    tokens.count = count
    _mixer_expect_shape("kv_window_steps n_selected", n_selected, (count,))
    _mixer_expect_shape("kv_window_steps selected", selected, (count, keep_blocks))
    tokens.positions = _mixer_ints(positions, keep)
    tokens.n_selected = _mixer_ints(n_selected, keep)
    tokens.selected = _mixer_ints(selected, keep) if keep_blocks > 0 else NULL
    tokens.resets = _window_bytes("resets", resets, (count,), keep)
    tokens.key_rows = _window_bytes("key_rows", key_rows, (count, s.key_row), keep)
    tokens.value_rows = _window_bytes("value_rows", value_rows, (count, s.value_row), keep)
    tokens.q = tokens.q_gate = NULL
    if q is not None:
        _mixer_expect_shape("kv_window_steps q", q, (count, heads, head_dim))
        _mixer_expect_shape("kv_window_steps q_gate", q_gate, (count, heads, 2 * head_dim))
        tokens.q, tokens.q_gate = _mixer_floats(q, keep), _mixer_floats(q_gate, keep)
    cdef const unsigned char* p_keys = _window_bytes("host_keys", host_keys, (s.host_keys,), keep)
    cdef const unsigned char* p_values = _window_bytes("host_values", host_values, (s.host_values,), keep)

    result = {"slot_of": np.empty((count, blocks), np.int32), "owner": np.empty((count, slots), np.int32),
              "stamps": np.empty((count, slots), np.int32), "fetched": np.empty(count, np.ulonglong),
              "window_keys": np.empty((count, s.window_keys), np.uint8),
              "window_values": np.empty((count, s.window_values), np.uint8),
              "host_keys": np.empty(s.host_keys, np.uint8), "host_values": np.empty(s.host_values, np.uint8)}
    reset = {"slot_of": np.empty(blocks, np.int32), "owner": np.empty(slots, np.int32),
             "stamps": np.empty(slots, np.int32), "fetched": np.empty(1, np.ulonglong)}
    cdef KvWindowCheckOutputs out
    out.slot_of, out.owner = _mixer_ints(result["slot_of"], keep), _mixer_ints(result["owner"], keep)
    out.stamps, out.fetched = _mixer_ints(result["stamps"], keep), _window_counters(result["fetched"], keep)
    out.window_keys = _chunk_bytes(result["window_keys"].reshape(-1), keep)
    out.window_values = _chunk_bytes(result["window_values"].reshape(-1), keep)
    out.host_keys = _chunk_bytes(result["host_keys"], keep)
    out.host_values = _chunk_bytes(result["host_values"], keep)
    out.out_window = out.out_whole = NULL
    if q is not None:
        result["out_window"] = np.empty((count, heads, head_dim), np.float32)
        result["out_whole"] = np.empty((count, heads, head_dim), np.float32)
        out.out_window = _mixer_floats(result["out_window"], keep)
        out.out_whole = _mixer_floats(result["out_whole"], keep)
    out.reset_slot_of, out.reset_owner = _mixer_ints(reset["slot_of"], keep), _mixer_ints(reset["owner"], keep)
    out.reset_stamps = _mixer_ints(reset["stamps"], keep)
    out.reset_fetched = _window_counters(reset["fetched"], keep)
    with nogil:
        cpp_kv_window_steps(device, shape, p_keys, p_values, tokens, out)
    result["fetched"] = result["fetched"].astype(np.uint64)
    reset["fetched"] = int(reset["fetched"][0])
    result["reset"] = reset
    return result
