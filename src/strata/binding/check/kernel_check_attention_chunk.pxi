# The chunk attention kernels against the decode kernels run token by token (strata::kernel_check,
# kernel_check_attention_chunk.hpp). For tests only. Uses the mixer round trips' helpers
# (kernel_check_mixers.pxi, included before this file).
from strata.libstrata.check.kernel_check_attention_chunk cimport (
    ChunkCheckOutputs, cpp_attention_chunk_scratch, cpp_attention_chunk_spans, cpp_attention_chunk_vs_decode,
    cpp_chunk_cache_bytes,
)


cdef unsigned char* _chunk_bytes(arr, keep: list) except? NULL:
    keep.append(arr)
    cdef unsigned char[::1] v = arr
    return &v[0]


cdef dict _chunk_path_outputs(ChunkCheckOutputs* to, const AttentionCheckShape& shape, const QsaCheckInputs& qsa,
                              int start, int chunk, int n_pages, list keep):
    """Arrays for what one path leaves (kernel_check_attention_chunk.hpp, ChunkCheckOutputs), with `to` pointing
    into them."""
    heads, kv_heads, d, tokens = shape.n_head, shape.n_head_kv, shape.head_dim, start + chunk
    result = {name: np.empty((chunk, heads, d), np.float32) for name in ("out", "q")}
    result.update({name: np.empty((kv_heads, tokens, d), np.float32) for name in ("k_cache", "v_cache")})
    result["k_bytes"] = np.empty(cpp_chunk_cache_bytes(shape, n_pages, False), np.uint8)
    result["v_bytes"] = np.empty(cpp_chunk_cache_bytes(shape, n_pages, True), np.uint8)
    to.out, to.q = _mixer_floats(result["out"], keep), _mixer_floats(result["q"], keep)
    to.k_cache, to.v_cache = _mixer_floats(result["k_cache"], keep), _mixer_floats(result["v_cache"], keep)
    to.k_bytes, to.v_bytes = _chunk_bytes(result["k_bytes"], keep), _chunk_bytes(result["v_bytes"], keep)
    if qsa.q == NULL:
        return result
    max_blocks = tokens // qsa.ratio + 1
    result["raw_keys"] = np.empty((max_blocks * qsa.ratio, qsa.head_dim), np.float32)
    result["block_keys"] = np.empty((max_blocks, qsa.head_dim), np.float32)
    result["selected"] = np.empty((chunk, qsa.keep_blocks), np.int32)
    result["n_selected"] = np.empty(chunk, np.int32)
    to.raw_keys, to.block_keys = _mixer_floats(result["raw_keys"], keep), _mixer_floats(result["block_keys"], keep)
    to.selected, to.n_selected = _mixer_ints(result["selected"], keep), _mixer_ints(result["n_selected"], keep)
    return result


def attention_chunk_vs_decode(q_gate, k, v, q_norm, k_norm, rope_cos, rope_sin, page_order, *, int start,
                              int page_size, kv="bf16", float eps=1e-6, indexer=None, bint gathered=False,
                              int device=0) -> dict:
    """Tokens 0..start-1 decode one by one; tokens start..steps-1 then run both token by token through the decode
    kernels ("stepwise") and at once through the chunk kernels ("at_once"), from the same cache state.

    Inputs as attention_steps takes them, stacked over all steps tokens. Each path's dict holds out, q
    ([chunk, H, d]), k_bytes, v_bytes (each cache half as stored, uint8), k_cache, v_cache ([Hkv, steps, d],
    dequantized) and with QSA raw_keys, block_keys (the indexer caches as stored, NaN where never written),
    selected [chunk, keep_blocks] (-1 padded) and n_selected [chunk]. attention_chunk runs gathered (each query
    reading its own tokens compacted) or scanned (a tile of queries walking the union of their tokens).
    "spans_scratch" is the scratch (floats) attention_chunk took, for either mode; "spans" the spans it cut each
    query's tokens into in the mode it ran (1: none, no merge).
    """
    cdef AttentionCheckShape shape = _attention_check_shape("attention_chunk_vs_decode", q_gate, k, v, q_norm,
                                                            k_norm, rope_cos, rope_sin, page_size, kv, eps)
    steps = np.shape(q_gate)[0]
    if not 0 <= start < steps:
        raise InvalidArgument(f"attention_chunk_vs_decode: start {start} must be in [0, {steps}) tokens")
    keep = []
    cdef QsaCheckInputs qsa = _qsa_check_inputs("attention_chunk_vs_decode", indexer, steps, shape.rope_dim, keep)
    cdef int n_pages = np.size(page_order), c_start = start, chunk = steps - start
    cdef ChunkCheckOutputs stepwise, at_once
    result = {"stepwise": _chunk_path_outputs(&stepwise, shape, qsa, start, chunk, n_pages, keep),
              "at_once": _chunk_path_outputs(&at_once, shape, qsa, start, chunk, n_pages, keep)}
    cdef const float* p_qg = _mixer_floats(q_gate, keep)
    cdef const float* p_k = _mixer_floats(k, keep)
    cdef const float* p_v = _mixer_floats(v, keep)
    cdef const float* p_qn = _mixer_floats(q_norm, keep)
    cdef const float* p_kn = _mixer_floats(k_norm, keep)
    cdef const float* p_cos = _mixer_floats(rope_cos, keep)
    cdef const float* p_sin = _mixer_floats(rope_sin, keep)
    cdef const int* p_pages = _mixer_ints(page_order, keep)
    result["spans_scratch"] = cpp_attention_chunk_scratch(shape, chunk)
    result["spans"] = cpp_attention_chunk_spans(shape, chunk, gathered)
    with nogil:
        cpp_attention_chunk_vs_decode(device, shape, c_start, chunk, gathered, p_qg, p_k, p_v, p_qn, p_kn, p_cos,
                                      p_sin, p_pages, n_pages, qsa, stepwise, at_once)
    return result
