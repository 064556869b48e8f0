# Decode-step mixer and plumbing round trips (strata::kernel_check, kernel_check_mixers.hpp): GDN steps and chunk, paged
# attention + QSA through a captured graph, the KV rotation, QSA block selection, embedding gather, doorbell.
# For tests only.
from libc.stdint cimport uint16_t

from strata._native cimport kv_storage
from strata.libstrata.check.kernel_check_mixers cimport (
    AttentionCheckShape, DoorbellCheckResult, GdnCheckShape, QsaCheckInputs, QsaCheckOutputs, cpp_attention_steps,
    cpp_doorbell_round_trip, cpp_embed_rows, cpp_gdn_steps, cpp_kv_rotate_rows, cpp_ple_steps, cpp_qsa_top_blocks,
)
from strata.libstrata.check.kernel_check_mixers cimport (
    AttentionTimingShape, IndexerTimingShape, cpp_time_attention_decode, cpp_time_qsa_select,
)
from strata.libstrata.check.kernel_check_mixers cimport cpp_gdn_chunk


cdef float* _mixer_floats(arr, keep: list) except? NULL:
    """Address of arr as a C-contiguous float32 array (NULL for None); the array is kept alive in `keep`."""
    if arr is None:
        return NULL
    a = np.ascontiguousarray(arr, dtype=np.float32)
    if a.size == 0:
        raise InvalidArgument(f"an input array is empty (shape {a.shape})")
    keep.append(a)
    cdef const float[::1] v = a.reshape(-1)
    return <float*>&v[0]


cdef int* _mixer_ints(arr, keep: list) except? NULL:
    a = np.ascontiguousarray(arr, dtype=np.int32)
    if a.size == 0:
        raise InvalidArgument(f"an input array is empty (shape {a.shape})")
    keep.append(a)
    cdef const int[::1] v = a.reshape(-1)
    return <int*>&v[0]


def _mixer_expect_shape(name: str, arr, shape: tuple) -> None:
    if tuple(np.shape(arr)) != tuple(shape):
        raise InvalidArgument(f"{name}: expected shape {tuple(shape)}, found {tuple(np.shape(arr))}")


cdef struct _GdnInputs:
    GdnCheckShape shape
    int steps
    const float* qkv
    const float* z
    const float* beta_in
    const float* alpha_in
    const float* conv_weight
    const float* ssm_a
    const float* dt_bias
    const float* norm_weight
    float* conv_state
    float* state


cdef _GdnInputs _gdn_inputs(str name, qkv, z, beta_in, alpha_in, conv_weight, ssm_a, dt_bias, norm_weight,
                            conv_arr, state_arr, int n_k_heads, bint tiled_heads, bint interleaved_ba,
                            bint sigmoid_gate, float eps, list keep) except *:
    """The shape and the input addresses of a GDN round trip (steps or chunk), every shape checked."""
    if state_arr.ndim != 3 or np.ndim(conv_weight) != 2 or np.ndim(qkv) != 2:
        raise InvalidArgument(f"{name}: state must be [Hv, dk, dv], conv_weight [C, K] and qkv [steps, C]")
    hv, dk, dv = state_arr.shape
    channels, kernel = np.shape(conv_weight)
    steps = np.shape(qkv)[0]
    if n_k_heads <= 0 or hv % n_k_heads or channels != 2 * n_k_heads * dk + hv * dv:
        raise InvalidArgument(f"{name}: conv_weight has {channels} channels; expected 2*{n_k_heads}*{dk} + "
                              f"{hv}*{dv} with {hv} v-heads a multiple of {n_k_heads} k-heads")
    _mixer_expect_shape(f"{name} qkv", qkv, (steps, channels))
    _mixer_expect_shape(f"{name} z", z, (steps, hv * dv))
    _mixer_expect_shape(f"{name} beta_in", beta_in, (steps, 2 * hv if interleaved_ba else hv))
    if not interleaved_ba:
        _mixer_expect_shape(f"{name} alpha_in", alpha_in, (steps, hv))
    _mixer_expect_shape(f"{name} conv_state", conv_arr, (kernel - 1, channels))
    cdef _GdnInputs inputs
    inputs.shape.n_k_heads, inputs.shape.n_v_heads, inputs.shape.head_k_dim = n_k_heads, hv, dk
    inputs.shape.head_v_dim, inputs.shape.conv_kernel, inputs.shape.eps = dv, kernel, eps
    inputs.shape.tiled_heads, inputs.shape.interleaved_ba = tiled_heads, interleaved_ba
    inputs.shape.sigmoid_gate = sigmoid_gate
    inputs.steps = steps
    inputs.qkv = _mixer_floats(qkv, keep)
    inputs.z = _mixer_floats(z, keep)
    inputs.beta_in = _mixer_floats(beta_in, keep)
    inputs.alpha_in = _mixer_floats(None if interleaved_ba else alpha_in, keep)
    inputs.conv_weight = _mixer_floats(conv_weight, keep)
    inputs.ssm_a = _mixer_floats(ssm_a, keep)
    inputs.dt_bias = _mixer_floats(dt_bias, keep)
    inputs.norm_weight = _mixer_floats(norm_weight, keep)
    inputs.conv_state = _mixer_floats(conv_arr, keep)
    inputs.state = _mixer_floats(state_arr, keep)
    return inputs


def gdn_steps(qkv, z, beta_in, alpha_in, conv_weight, ssm_a, dt_bias, norm_weight, conv_state, state, *,
              int n_k_heads, bint tiled_heads, bint interleaved_ba, bint sigmoid_gate, float eps, int device=0,
              bint q8=False):
    """Runs len(qkv) Gated DeltaNet decode tokens on the GPU; returns (out [steps, Hv*dv], conv_state, state), and
    with q8 the q8_32 form gdn_step writes beside each step's out: (xq [steps, Hv*dv], dx, sums [steps, Hv*dv/32]).

    qkv [steps, C]; z [steps, Hv*dv]; beta_in [steps, Hv] (interleaved_ba: ssm_ba [steps, 2*Hv]); alpha_in
    [steps, Hv] or None when interleaved; conv_weight [C, K]; ssm_a, dt_bias [Hv]; norm_weight [dv];
    conv_state [K-1, C] and state [Hv, dk, dv] are the starting state (not modified).
    """
    state_arr = np.array(state, dtype=np.float32, order="C")
    conv_arr = np.array(conv_state, dtype=np.float32, order="C")
    keep = []
    cdef _GdnInputs i = _gdn_inputs("gdn_steps", qkv, z, beta_in, alpha_in, conv_weight, ssm_a, dt_bias, norm_weight,
                                    conv_arr, state_arr, n_k_heads, tiled_heads, interleaved_ba, sigmoid_gate, eps,
                                    keep)
    out = np.empty((i.steps, np.shape(z)[1]), np.float32)
    cdef float* p_out = _mixer_floats(out, keep)
    q8_arrays = _q8_arrays(i.steps, np.shape(z)[1]) if q8 else None
    cdef Q8Host q8_host = _q8_host(q8_arrays)
    with nogil:
        cpp_gdn_steps(device, i.shape, i.steps, i.qkv, i.z, i.beta_in, i.alpha_in, i.conv_weight, i.ssm_a,
                      i.dt_bias, i.norm_weight, i.conv_state, i.state, p_out, q8_host)
    return (out, conv_arr, state_arr, q8_arrays) if q8 else (out, conv_arr, state_arr)


def gdn_chunk(qkv, z, beta_in, alpha_in, conv_weight, ssm_a, dt_bias, norm_weight, conv_state, state, *,
              int n_k_heads, bint tiled_heads, bint interleaved_ba, bint sigmoid_gate, float eps, int row_pad=0,
              bint row_states=False, int device=0):
    """The same tokens as gdn_steps through one GDN chunk launch (captured into a CUDA graph); returns (out
    [tokens, Hv*dv], conv_out [tokens, C], conv_state, state), and with `row_states` also (state_rows
    [tokens, *state.shape], conv_rows [tokens, *conv_state.shape]): the state and conv history after each token.

    Arguments as gdn_steps'. On the device qkv and z share one fused row per token and every input and output
    row is followed by `row_pad` poisoned floats (the round trip fails if the kernels write any of them).
    """
    state_arr = np.array(state, dtype=np.float32, order="C")
    conv_arr = np.array(conv_state, dtype=np.float32, order="C")
    keep = []
    cdef _GdnInputs i = _gdn_inputs("gdn_chunk", qkv, z, beta_in, alpha_in, conv_weight, ssm_a, dt_bias, norm_weight,
                                    conv_arr, state_arr, n_k_heads, tiled_heads, interleaved_ba, sigmoid_gate, eps,
                                    keep)
    out = np.empty((i.steps, np.shape(z)[1]), np.float32)
    conv_out = np.empty(np.shape(qkv), np.float32)
    cdef float* p_out = _mixer_floats(out, keep)
    cdef float* p_conv_out = _mixer_floats(conv_out, keep)
    state_rows = np.empty((i.steps, *state_arr.shape), np.float32) if row_states else None
    conv_rows = np.empty((i.steps, *conv_arr.shape), np.float32) if row_states else None
    cdef float* p_state_rows = _mixer_floats(state_rows, keep) if row_states else NULL
    cdef float* p_conv_rows = _mixer_floats(conv_rows, keep) if row_states else NULL
    with nogil:
        cpp_gdn_chunk(device, i.shape, i.steps, row_pad, i.qkv, i.z, i.beta_in, i.alpha_in, i.conv_weight, i.ssm_a,
                      i.dt_bias, i.norm_weight, i.conv_state, i.state, p_conv_out, p_out, p_state_rows, p_conv_rows)
    if row_states:
        return out, conv_out, conv_arr, state_arr, state_rows, conv_rows
    return out, conv_out, conv_arr, state_arr


def attention_steps(q_gate, k, v, q_norm, k_norm, rope_cos, rope_sin, page_order, *, int page_size,
                    kv="bf16", float eps=1e-6, indexer=None, int device=0, bint q8=False) -> dict:
    """Tokens 0..steps-1 of gated attention over a paged KV cache in format `kv` (a strata.KV), replayed through
    one captured CUDA graph.

    q_gate [steps, H, 2d]; k, v [steps, Hkv, d]; rope_cos/sin [steps, rope_dim/2]; page_order [n_pages]
    (logical page -> physical page). `indexer` (QSA) is None or a dict with q [steps, Hi, di], kraw
    [steps, di], q_norm, k_norm [di], keep_blocks and optionally ratio (tokens per block, default 4). Returns out,
    q ([steps, H, d], in the keys' basis: rotated for Q4 keys), k_cache, v_cache ([Hkv, steps, d], as stored,
    dequantized; a Q4 half in its rotated basis) and with QSA: scores [steps, steps // ratio] (NaN past each
    step's blocks), selected [steps, keep_blocks] (-1 padded), n_selected [steps]. With q8 also "q8": the q8_32
    form attention_decode writes beside each step's out, (xq [steps, H*d], dx, sums [steps, H*d/32]).
    """
    cdef AttentionCheckShape shape = _attention_check_shape("attention_steps", q_gate, k, v, q_norm, k_norm,
                                                            rope_cos, rope_sin, page_size, kv, eps)
    steps, heads, kv_heads, d = np.shape(q_gate)[0], shape.n_head, shape.n_head_kv, shape.head_dim
    keep = []
    result = {name: np.empty((steps, heads, d), np.float32) for name in ("out", "q")}
    result.update({name: np.empty((kv_heads, steps, d), np.float32) for name in ("k_cache", "v_cache")})
    cdef QsaCheckInputs qsa = _qsa_check_inputs("attention_steps", indexer, steps, shape.rope_dim, keep)
    cdef QsaCheckOutputs qsa_out
    if qsa.q != NULL:
        result["scores"] = np.full((steps, max(steps // qsa.ratio, 1)), np.nan, np.float32)
        result["selected"] = np.empty((steps, qsa.keep_blocks), np.int32)
        result["n_selected"] = np.empty(steps, np.int32)
        qsa_out.scores = _mixer_floats(result["scores"], keep)
        qsa_out.selected = _mixer_ints(result["selected"], keep)
        qsa_out.n_selected = _mixer_ints(result["n_selected"], keep)
    cdef const float* p_qg = _mixer_floats(q_gate, keep)
    cdef const float* p_k = _mixer_floats(k, keep)
    cdef const float* p_v = _mixer_floats(v, keep)
    cdef const float* p_qn = _mixer_floats(q_norm, keep)
    cdef const float* p_kn = _mixer_floats(k_norm, keep)
    cdef const float* p_cos = _mixer_floats(rope_cos, keep)
    cdef const float* p_sin = _mixer_floats(rope_sin, keep)
    cdef const int* p_pages = _mixer_ints(page_order, keep)
    cdef int n_pages = np.size(page_order), n_steps = steps
    cdef float* p_out = _mixer_floats(result["out"], keep)
    cdef float* p_q = _mixer_floats(result["q"], keep)
    cdef float* p_kc = _mixer_floats(result["k_cache"], keep)
    cdef float* p_vc = _mixer_floats(result["v_cache"], keep)
    if q8:
        result["q8"] = _q8_arrays(steps, heads * d)
    cdef Q8Host q8_host = _q8_host(result.get("q8"))
    with nogil:
        cpp_attention_steps(device, shape, n_steps, p_qg, p_k, p_v, p_qn, p_kn, p_cos, p_sin, p_pages, n_pages,
                            qsa, qsa_out, p_out, p_q, p_kc, p_vc, q8_host)
    return result


cdef AttentionCheckShape _attention_check_shape(str name, q_gate, k, v, q_norm, k_norm, rope_cos, rope_sin,
                                                int page_size, kv, float eps) except *:
    """The shape of an attention check's stacked inputs, checked: q_gate [steps, H, 2d], k, v [steps, Hkv, d],
    q_norm, k_norm [d] and rope_cos/sin [steps, rope_dim/2]."""
    if np.ndim(q_gate) != 3 or np.ndim(k) != 3:
        raise InvalidArgument(f"{name}: q_gate must be [steps, H, 2d] and k [steps, Hkv, d]")
    steps, heads, two_d = np.shape(q_gate)
    kv_heads, d = np.shape(k)[1], np.shape(k)[2]
    half = np.shape(rope_cos)[1] if np.ndim(rope_cos) == 2 else -1
    if two_d != 2 * d or kv_heads <= 0 or heads % kv_heads or d % 32 or d > 512 or half <= 0 or 2 * half > d:
        raise InvalidArgument(f"{name}: need q_gate [steps, H, 2d] with H a multiple of {kv_heads} kv "
                              f"heads, d ({d}) a multiple of 32 up to 512 and 0 < rope_dim <= d; "
                              f"found q_gate {np.shape(q_gate)}, rope table {np.shape(rope_cos)}")
    _mixer_expect_shape(f"{name} k", k, (steps, kv_heads, d))
    _mixer_expect_shape(f"{name} v", v, (steps, kv_heads, d))
    _mixer_expect_shape(f"{name} q_norm", q_norm, (d,))
    _mixer_expect_shape(f"{name} k_norm", k_norm, (d,))
    _mixer_expect_shape(f"{name} rope_sin", rope_sin, (steps, half))
    cdef AttentionCheckShape shape
    shape.n_head, shape.n_head_kv, shape.head_dim, shape.rope_dim = heads, kv_heads, d, 2 * half
    shape.page_size, shape.kv, shape.eps = page_size, kv_storage(kv), eps
    return shape


cdef QsaCheckInputs _qsa_check_inputs(str name, indexer, int steps, int rope_dim, list keep) except *:
    """The QSA inputs of an attention check from `indexer` (None: QSA off, q NULL), checked: a dict with q
    [steps, Hi, di], kraw [steps, di], q_norm, k_norm [di], keep_blocks and optionally ratio (default 4). The
    arrays are kept alive in `keep`."""
    cdef QsaCheckInputs qsa
    qsa.q = NULL
    if indexer is None:
        return qsa
    iq = np.asarray(indexer["q"])
    if iq.ndim != 3 or iq.shape[0] != steps:
        raise InvalidArgument(f"{name}: indexer q must be [{steps}, Hi, di], found {iq.shape}")
    qsa.n_heads, qsa.head_dim, qsa.keep_blocks = iq.shape[1], iq.shape[2], int(indexer["keep_blocks"])
    qsa.ratio = int(indexer.get("ratio", 4))
    if qsa.keep_blocks <= 0 or qsa.ratio <= 0 or rope_dim > qsa.head_dim:
        raise InvalidArgument(f"{name}: indexer keep_blocks {qsa.keep_blocks} and ratio {qsa.ratio} "
                              f"must be > 0 and its head_dim {qsa.head_dim} at least rope_dim {rope_dim}")
    _mixer_expect_shape(f"{name} indexer kraw", indexer["kraw"], (steps, qsa.head_dim))
    _mixer_expect_shape(f"{name} indexer q_norm", indexer["q_norm"], (qsa.head_dim,))
    _mixer_expect_shape(f"{name} indexer k_norm", indexer["k_norm"], (qsa.head_dim,))
    qsa.q = _mixer_floats(iq, keep)
    qsa.kraw = _mixer_floats(indexer["kraw"], keep)
    qsa.q_norm = _mixer_floats(indexer["q_norm"], keep)
    qsa.k_norm = _mixer_floats(indexer["k_norm"], keep)
    return qsa


def kv_rotate_rows(x, int device=0):
    """The KV rotation kernel alone (kernels/kv_rotation.cuh) on each row of x (float32 [rows, head_dim])."""
    if np.ndim(x) != 2:
        raise InvalidArgument(f"kv_rotate_rows: x must be [rows, head_dim], found shape {np.shape(x)}")
    rows, head_dim = np.shape(x)
    keep = []
    out = np.empty((rows, head_dim), np.float32)
    cdef const float* p_x = _mixer_floats(x, keep)
    cdef float* p_out = _mixer_floats(out, keep)
    cdef int c_rows = rows, c_dim = head_dim
    with nogil:
        cpp_kv_rotate_rows(device, c_rows, c_dim, p_x, p_out)
    return out


def qsa_top_blocks(scores, int keep_blocks, int device=0):
    """The QSA selection kernel alone: the best min(keep_blocks, len(scores)) blocks, ascending (ties: lower index)."""
    keep = []
    cdef const float* p_scores = _mixer_floats(scores, keep)
    cdef int n_blocks = np.size(scores), count
    chosen = np.empty(max(keep_blocks, 1), np.int32)
    cdef int* p_chosen = _mixer_ints(chosen, keep)
    with nogil:
        count = cpp_qsa_top_blocks(device, p_scores, n_blocks, keep_blocks, p_chosen)
    return chosen[:count].copy()


def time_attention_decode(*, int heads, int kv_heads, int head_dim, kv="bf16", int context, int keep_blocks=0,
                          int ratio=4, int page_size=64, int reps=200, int device=0) -> float:
    """Median seconds of one attention_decode at `context` visible tokens, the L2 cold (benchmarks only).

    keep_blocks > 0 attends that many QSA blocks of `ratio` tokens, spread over the context, plus the open tail.
    """
    cdef AttentionTimingShape shape
    shape.n_head, shape.n_head_kv, shape.head_dim, shape.page_size = heads, kv_heads, head_dim, page_size
    shape.kv, shape.context, shape.keep_blocks, shape.ratio = kv_storage(kv), context, keep_blocks, ratio
    cdef double seconds
    with nogil:
        seconds = cpp_time_attention_decode(device, shape, reps)
    return seconds


def time_qsa_select(*, int heads, int head_dim, int context, int keep_blocks, int ratio=4, bint top_only=False,
                    int reps=200, int device=0) -> float:
    """Median seconds of one qsa_select (or with top_only its selection step alone) at `context` visible tokens
    over random block keys, the L2 cold (benchmarks only)."""
    cdef IndexerTimingShape shape
    shape.n_heads, shape.head_dim, shape.ratio, shape.keep_blocks = heads, head_dim, ratio, keep_blocks
    shape.context = context
    cdef double seconds
    with nogil:
        seconds = cpp_time_qsa_select(device, shape, top_only, reps)
    return seconds


def ple_steps(streams, key, value, norm_key, norm_query, norm_conv, conv_weight, history, *, int dilation,
              float eps, bint chunk=False, bint row_states=False, int device=0):
    """PLE device half for len(streams) tokens; returns (addend [steps, hc, n], history), and with `row_states`
    (ple_chunk's) also the history as each token leaves it [steps, dilation*(K-1), hc*n].

    streams [steps, hc, n]; key [steps, hc*n]; value [steps, n]; norm_* [hc*n]; conv_weight [hc*n, K];
    history [dilation*(K-1), hc*n] is the starting conv history (not modified). ple_step runs once per token, or
    with `chunk` ple_chunk once over all of them.
    """
    if np.ndim(streams) != 3 or np.ndim(conv_weight) != 2:
        raise InvalidArgument("ple_steps: streams must be [steps, hc, n] and conv_weight [hc*n, K]")
    steps, hc, n = np.shape(streams)
    kernel = np.shape(conv_weight)[1]
    hist = np.array(history, dtype=np.float32, order="C")
    _mixer_expect_shape("ple_steps key", key, (steps, hc * n))
    _mixer_expect_shape("ple_steps value", value, (steps, n))
    _mixer_expect_shape("ple_steps conv_weight", conv_weight, (hc * n, kernel))
    _mixer_expect_shape("ple_steps history", hist, (dilation * (kernel - 1), hc * n))
    keep = []
    out = np.empty((steps, hc, n), np.float32)
    cdef const float* p_s = _mixer_floats(streams, keep)
    cdef const float* p_k = _mixer_floats(key, keep)
    cdef const float* p_v = _mixer_floats(value, keep)
    cdef const float* p_nk = _mixer_floats(norm_key, keep)
    cdef const float* p_nq = _mixer_floats(norm_query, keep)
    cdef const float* p_nc = _mixer_floats(norm_conv, keep)
    cdef const float* p_w = _mixer_floats(conv_weight, keep)
    cdef float* p_h = _mixer_floats(hist, keep)
    cdef float* p_out = _mixer_floats(out, keep)
    history_rows = np.empty((steps, *hist.shape), np.float32) if row_states else None
    cdef float* p_rows = _mixer_floats(history_rows, keep) if row_states else NULL
    cdef int c_steps = steps, c_hc = hc, c_n = n, c_kernel = kernel
    with nogil:
        cpp_ple_steps(device, c_hc, c_n, dilation, c_kernel, eps, c_steps, chunk, p_s, p_k, p_v, p_nk, p_nq, p_nc,
                      p_w, p_h, p_out, p_rows)
    return (out, hist, history_rows) if row_states else (out, hist)


_EMBED_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2, np.dtype(np.uint8): 3}


def embed_rows(table, ids, d=None, int device=0):
    """Rows `ids` of `table` as float32 [len(ids), cols] on GPU `device`.

    table: float32, float16, uint16 (bf16 bits) [rows, cols], or uint8 Q8_0-form codes (value = code - 128)
    with d: the fp16 scales [rows, cols/32] (float16 or their uint16 bits).
    """
    arr = np.ascontiguousarray(table)
    kind = _EMBED_KINDS.get(arr.dtype)
    if kind is None or arr.ndim != 2 or (kind == 3) != (d is not None):
        raise InvalidArgument(f"embed_rows: table must be 2-D float32/float16/uint16(bf16)/uint8(Q8_0 codes, with "
                              f"d) ; found {arr.dtype}{list(arr.shape)} with d {'given' if d is not None else 'absent'}")
    rows, cols = arr.shape
    keep = [arr]
    cdef const unsigned char[::1] data = arr.reshape(-1).view(np.uint8)
    cdef const uint16_t* p_d = NULL
    cdef const uint16_t[::1] d_view
    if d is not None:
        d_arr = np.ascontiguousarray(d).view(np.uint16)
        _mixer_expect_shape("embed_rows d", d_arr, (rows, cols // 32))
        keep.append(d_arr)
        d_view = d_arr.reshape(-1)
        p_d = &d_view[0]
    cdef const int* p_ids = _mixer_ints(ids, keep)
    cdef int n_ids = np.size(ids), c_kind = kind, c_rows = rows, c_cols = cols
    out = np.empty((n_ids, cols), np.float32)
    cdef float* p_out = _mixer_floats(out, keep)
    with nogil:
        cpp_embed_rows(device, c_kind, c_rows, c_cols, &data[0], p_d, p_ids, n_ids, p_out)
    return out


def doorbell_round_trip(x, ids, weights, int ring_base, int ring_offset, answer_row=None,
                        long long timeout_ns=2_000_000_000, int device=0) -> dict:
    """Publish x/ids/weights through mapped pinned memory, let a host thread answer (if answer_row is given),
    and wait on the device. Returns published_x, published_ids, published_weights (what the host read),
    answered (the device's copy of the answer; NaN on a timeout), status (0 or the layer offset of the ring that
    timed out) and seq_seen."""
    keep = []
    n, k = np.size(x), np.size(ids)
    if np.size(weights) != k or (answer_row is not None and np.size(answer_row) != n):
        raise InvalidArgument(f"doorbell_round_trip: {k} ids need {k} weights (found {np.size(weights)}) and an "
                              f"answer row of {n} (found {np.size(answer_row) if answer_row is not None else 0})")
    result = {"published_x": np.zeros(n, np.float32), "published_ids": np.zeros(k, np.int32),
              "published_weights": np.zeros(k, np.float32), "answered": np.empty(n, np.float32)}
    cdef const float* p_x = _mixer_floats(x, keep)
    cdef const int* p_ids = _mixer_ints(ids, keep)
    cdef const float* p_w = _mixer_floats(weights, keep)
    cdef const float* p_answer = _mixer_floats(answer_row, keep)
    cdef float* p_px = _mixer_floats(result["published_x"], keep)
    cdef int* p_pids = _mixer_ints(result["published_ids"], keep)
    cdef float* p_pw = _mixer_floats(result["published_weights"], keep)
    cdef float* p_answered = _mixer_floats(result["answered"], keep)
    cdef int c_n = n, c_k = k
    cdef bint answer = answer_row is not None
    cdef DoorbellCheckResult r
    with nogil:
        r = cpp_doorbell_round_trip(device, c_n, c_k, p_x, p_ids, p_w, ring_base, ring_offset, answer, p_answer,
                                    timeout_ns, p_px, p_pids, p_pw, p_answered)
    result["status"], result["seq_seen"] = r.status, r.seq_seen
    return result
