# The decode room: one sequence on the GPU and the CPU pool (cuda/include/strata/decode_session.hpp).
from libcpp cimport bool as cbool

cdef extern from "strata/decode_session.hpp" nogil:
    cdef enum class DecodeArch "strata::Arch":
        Qwen4Exp
        Qwen3Next
        Qwen35Moe

    cdef enum class DecodeMode "strata::DecodeMode":
        kUncaptured
        kLayerGraphs
        kTokenGraph

    cdef cppclass DecodeGeometry "strata::DecodeGeometry":
        DecodeArch arch
        int n_layer, n_embd, n_vocab
        vector[cbool] recurrent
        int n_head, n_head_kv, head_dim, rope_dim
        double rope_theta
        float rms_eps
        int ssm_k_heads, ssm_v_heads, ssm_head_k_dim, ssm_head_v_dim, ssm_conv_kernel
        int n_expert, n_expert_used, expert_ff, shared_ff
        int hc_count, hc_rank
        int indexer_heads, indexer_head_dim, indexer_budget
        vector[int] compress_ratios
        int ple_layer, ple_ngram, ple_conv_kernel, ple_n_heads, ple_head_dim

    cdef cppclass DecodeOptions "strata::DecodeOptions":
        int device
        int context
        KvStorage kv
        DecodeMode mode
        double timeout_seconds

    cdef cppclass SamplingValues "strata::SamplingValues":
        double temperature, top_p, min_p
        float repeat_penalty
        int top_k

    cdef cppclass DecodeStats "strata::DecodeStats":
        long tokens
        double seconds, ring_wait_seconds, pool_seconds
        long rings
        double gpu_pre_seconds, gpu_post_seconds

    cdef cppclass CppDecodeSession "strata::DecodeSession":
        CppDecodeSession(const CppDeviceWeights& weights, CppExpertPool& pool, const DecodeGeometry& geometry,
                         const DecodeOptions& options) except +raise_strata_error
        int step(int token, const float* ple_rows, const SamplingValues& sampling, double u,
                 cbool sample) except +raise_strata_error
        void logits(float* out) except +raise_strata_error
        void streams(float* out) except +raise_strata_error
        void reset() except +raise_strata_error
        int position()
        int context()
        DecodeMode mode()
        cbool captured()
        const DecodeStats& stats()


_ARCHS = {"qwen4exp": 0, "qwen3next": 1, "qwen35moe": 2}
_DECODE_MODES = ("uncaptured", "layer_graphs", "token_graph")
_GEOMETRY_INTS = ("n_layer", "n_embd", "n_vocab", "n_head", "n_head_kv", "head_dim", "rope_dim", "ssm_k_heads",
                  "ssm_v_heads", "ssm_head_k_dim", "ssm_head_v_dim", "ssm_conv_kernel", "n_expert", "n_expert_used",
                  "expert_ff", "shared_ff", "hc_count", "hc_rank", "indexer_heads", "indexer_head_dim",
                  "indexer_budget", "ple_layer", "ple_ngram", "ple_conv_kernel", "ple_n_heads", "ple_head_dim")


cdef DecodeGeometry _decode_geometry(dict g) except *:
    missing = [key for key in _GEOMETRY_INTS + ("arch", "recurrent", "rope_theta", "rms_eps", "compress_ratios")
               if key not in g]
    if missing:
        raise InvalidArgument(f"decode geometry lacks {', '.join(missing)} (strata.session_geometry builds it)")
    if g["arch"] not in _ARCHS:
        raise InvalidArgument(f"decode geometry: architecture {g['arch']!r} is not one of {', '.join(_ARCHS)}")
    cdef DecodeGeometry c
    c.arch = <DecodeArch><int>_ARCHS[g["arch"]]
    c.n_layer, c.n_embd, c.n_vocab = g["n_layer"], g["n_embd"], g["n_vocab"]
    c.n_head, c.n_head_kv, c.head_dim, c.rope_dim = g["n_head"], g["n_head_kv"], g["head_dim"], g["rope_dim"]
    c.rope_theta, c.rms_eps = g["rope_theta"], g["rms_eps"]
    c.ssm_k_heads, c.ssm_v_heads = g["ssm_k_heads"], g["ssm_v_heads"]
    c.ssm_head_k_dim, c.ssm_head_v_dim, c.ssm_conv_kernel = g["ssm_head_k_dim"], g["ssm_head_v_dim"], g["ssm_conv_kernel"]
    c.n_expert, c.n_expert_used, c.expert_ff, c.shared_ff = g["n_expert"], g["n_expert_used"], g["expert_ff"], g["shared_ff"]
    c.hc_count, c.hc_rank = g["hc_count"], g["hc_rank"]
    c.indexer_heads, c.indexer_head_dim, c.indexer_budget = g["indexer_heads"], g["indexer_head_dim"], g["indexer_budget"]
    c.ple_layer, c.ple_ngram, c.ple_conv_kernel = g["ple_layer"], g["ple_ngram"], g["ple_conv_kernel"]
    c.ple_n_heads, c.ple_head_dim = g["ple_n_heads"], g["ple_head_dim"]
    for flag in g["recurrent"]:
        c.recurrent.push_back(bool(flag))
    for ratio in g["compress_ratios"]:
        c.compress_ratios.push_back(int(ratio))
    return c


cdef class DecodeSession:
    """One sequence decoding on the GPU and the CPU expert pool (strata/decode_session.hpp).

    Keeps `weights` and `pool` alive while it lives. `step` feeds one token and returns the sampled next one.
    """
    cdef unique_ptr[CppDecodeSession] session
    cdef readonly object weights, pool
    cdef readonly int n_vocab, streams_width, ple_width

    def __cinit__(self, DeviceWeights weights, CpuExpertPool pool, dict geometry, *, int context, str kv,
                  str mode="token_graph", int device=0, double timeout=5.0):
        if kv not in _KV_STORAGE:
            raise InvalidArgument(f"kv must be one of {', '.join(_KV_STORAGE)}, got {kv!r}")
        if mode not in _DECODE_MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(_DECODE_MODES)}, got {mode!r}")
        if pool.pool == NULL:
            raise InvalidArgument("the expert pool is closed")
        cdef DecodeGeometry g = _decode_geometry(geometry)
        cdef DecodeOptions o
        o.device, o.context, o.timeout_seconds = device, context, timeout
        o.kv = <KvStorage>_KV_STORAGE[kv]
        o.mode = <DecodeMode><int>_DECODE_MODES.index(mode)
        self.weights, self.pool = weights, pool
        self.n_vocab = g.n_vocab
        self.streams_width = max(g.hc_count, 1) * g.n_embd
        self.ple_width = g.ple_n_heads * g.ple_head_dim if g.ple_layer >= 0 else 0
        with nogil:
            self.session.reset(new CppDecodeSession(weights.weights.get()[0], pool.pool[0], g, o))

    cdef CppDecodeSession* _open(self) except NULL:
        if not self.session:
            raise InvalidArgument("the decode session is closed")
        return self.session.get()

    def step(self, int token, ple_rows, tuple params, double u, bint sample=True) -> int:
        """Feed `token`; with `sample`, the next token for the draw u under params = (temperature, top_k,
        top_p, min_p, repeat_penalty), else -1. ple_rows: float32 [ple heads, ple head dim] or None."""
        cdef CppDecodeSession* s = self._open()
        cdef SamplingValues v
        v.temperature, v.top_k, v.top_p, v.min_p, v.repeat_penalty = params
        cdef const float[::1] rows
        cdef const float* rows_ptr = NULL
        if ple_rows is not None:
            rows = np.ascontiguousarray(ple_rows, dtype=np.float32).reshape(-1)
            if rows.shape[0] != self.ple_width:
                raise InvalidArgument(f"ple_rows has {rows.shape[0]} values; this model's PLE rows hold "
                                      f"{self.ple_width}")
            rows_ptr = &rows[0]
        cdef int out
        with nogil:
            out = s.step(token, rows_ptr, v, u, sample)
        return out

    def logits(self):
        """float32 [n_vocab] of the last step."""
        cdef CppDecodeSession* s = self._open()
        out = np.empty(self.n_vocab, np.float32)
        cdef float[::1] view = out
        with nogil:
            s.logits(&view[0])
        return out

    def streams(self):
        """The residual streams after the last step, float32 [streams * n_embd] (a test hook)."""
        cdef CppDecodeSession* s = self._open()
        out = np.empty(self.streams_width, np.float32)
        cdef float[::1] view = out
        with nogil:
            s.streams(&view[0])
        return out

    def reset(self) -> None:
        cdef CppDecodeSession* s = self._open()
        with nogil:
            s.reset()

    @property
    def position(self) -> int:
        return self._open().position()

    @property
    def context(self) -> int:
        return self._open().context()

    @property
    def mode(self) -> str:
        return _DECODE_MODES[<int>self._open().mode()]

    @property
    def captured(self) -> bool:
        return self._open().captured()

    def stats(self) -> dict:
        cdef DecodeStats st = self._open().stats()
        return {"tokens": st.tokens, "seconds": st.seconds, "ring_wait_seconds": st.ring_wait_seconds,
                "pool_seconds": st.pool_seconds, "rings": st.rings, "gpu_pre_seconds": st.gpu_pre_seconds,
                "gpu_post_seconds": st.gpu_post_seconds}

    def close(self) -> None:
        with nogil:
            self.session.reset()

    def __dealloc__(self):
        with nogil:
            self.session.reset()
