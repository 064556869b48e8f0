# The session room: the model geometry the core reads, the session's layout (the plan reads it), and one
# sequence decoding on the GPU and the CPU pool (cuda/include/strata/geometry.hpp, session_layout.hpp,
# decode_session.hpp).
from libcpp cimport bool as cbool
from libcpp.vector cimport vector

from libcpp.memory cimport unique_ptr

from strata._native_session cimport (
    CppReplacementPolicy, DecodeOptions, DecodeStats, ExpertMove, LayoutRegion, Place, PolicyOptions, SamplingValues,
    SessionLayout, TokenLogprobs, cpp_decode_scratch_bytes, cpp_expert_cache_bytes, cpp_expert_staging_bytes,
    cpp_prompt_scratch_bytes, cpp_sampler_workspace_bytes, cpp_plan_session, kKvPageTokens, kMaxSnapshots,
)

KV_PAGE_TOKENS = kKvPageTokens  # tokens per KV page: sessions hold whole pages
MAX_SNAPSHOTS = kMaxSnapshots   # state snapshot slots a session may have

_GEOMETRY_INTS = ("n_layer", "n_embd", "n_vocab", "n_head", "n_head_kv", "head_dim", "rope_dim", "ssm_n_k_heads",
                  "ssm_n_v_heads", "ssm_head_k_dim", "ssm_head_v_dim", "ssm_conv_kernel", "n_expert", "n_expert_used",
                  "expert_ff", "shared_ff", "hc_count", "hc_rank", "indexer_n_heads", "indexer_head_dim",
                  "indexer_top_k", "ple_layer", "ple_ngram", "ple_conv_kernel", "ple_n_heads", "ple_head_dim")
_GEOMETRY_FLAGS = ("gdn_tiled_heads", "gdn_interleaved_ba", "gdn_sigmoid_gate")
_GEOMETRY_FIELDS = frozenset(_GEOMETRY_INTS + _GEOMETRY_FLAGS + ("recurrent", "rope_theta", "rms_eps",
                                                                 "compress_ratios"))
_KV_STORAGE = {KV.BF16: KvStorage.Bf16, KV.INT8: KvStorage.Int8, KV.K8V4: KvStorage.K8V4, KV.Q4: KvStorage.Q4}
_DECODE_MODES = {Mode.UNCAPTURED: DecodeMode.kUncaptured, Mode.LAYER_GRAPHS: DecodeMode.kLayerGraphs,
                 Mode.TOKEN_GRAPH: DecodeMode.kTokenGraph}


cdef ModelGeometry model_geometry(dict g) except *:
    """The core's ModelGeometry from the fields strata.runtime.geometry.native_geometry writes; names a missing
    or unknown field."""
    missing = sorted(_GEOMETRY_FIELDS - g.keys())
    unknown = sorted(g.keys() - _GEOMETRY_FIELDS)
    if missing or unknown:
        raise InvalidArgument(f"model geometry: {'missing ' + ', '.join(missing) if missing else ''}"
                              f"{'; ' if missing and unknown else ''}"
                              f"{'unknown ' + ', '.join(unknown) if unknown else ''} "
                              "(strata.runtime.geometry.native_geometry writes every field)")
    cdef ModelGeometry c
    c.n_layer, c.n_embd, c.n_vocab = g["n_layer"], g["n_embd"], g["n_vocab"]
    c.n_head, c.n_head_kv, c.head_dim, c.rope_dim = g["n_head"], g["n_head_kv"], g["head_dim"], g["rope_dim"]
    c.rope_theta, c.rms_eps = g["rope_theta"], g["rms_eps"]
    c.ssm_n_k_heads, c.ssm_n_v_heads = g["ssm_n_k_heads"], g["ssm_n_v_heads"]
    c.ssm_head_k_dim, c.ssm_head_v_dim = g["ssm_head_k_dim"], g["ssm_head_v_dim"]
    c.ssm_conv_kernel = g["ssm_conv_kernel"]
    c.gdn_tiled_heads, c.gdn_interleaved_ba = g["gdn_tiled_heads"], g["gdn_interleaved_ba"]
    c.gdn_sigmoid_gate = g["gdn_sigmoid_gate"]
    c.n_expert, c.n_expert_used = g["n_expert"], g["n_expert_used"]
    c.expert_ff, c.shared_ff = g["expert_ff"], g["shared_ff"]
    c.hc_count, c.hc_rank = g["hc_count"], g["hc_rank"]
    c.indexer_n_heads, c.indexer_head_dim = g["indexer_n_heads"], g["indexer_head_dim"]
    c.indexer_top_k = g["indexer_top_k"]
    c.ple_layer, c.ple_ngram, c.ple_conv_kernel = g["ple_layer"], g["ple_ngram"], g["ple_conv_kernel"]
    c.ple_n_heads, c.ple_head_dim = g["ple_n_heads"], g["ple_head_dim"]
    for flag in g["recurrent"]:
        c.recurrent.push_back(bool(flag))
    for ratio in g["compress_ratios"]:
        c.compress_ratios.push_back(int(ratio))
    return c


cdef KvStorage kv_storage(object kv) except *:
    return _KV_STORAGE[KV.parse(kv)]  # every strata.KV has its storage; KV.parse names the choices


cdef DecodeMode decode_mode(object mode) except *:
    return _DECODE_MODES[Mode.parse(mode)]


cdef dict layout_dict(SessionLayout layout):
    return {"total": layout.total, "host_total": layout.host_total, "kv_pages": layout.kv_pages,
            "snapshots": layout.snapshots, "state_bytes": layout.state_bytes, "kv_streaming": layout.kv_streaming,
            "window_slots": layout.window_slots,
            "regions": [(r.name.decode(), r.layer, r.offset, r.bytes,
                         "host" if r.place == Place.Host else "device") for r in layout.regions]}


def session_layout(dict geometry, int context, kv, int snapshots=0, bint kv_streaming=False) -> dict:
    """The session arena's layout (strata/session_layout.hpp) for `context` tokens of KV in `kv` (a strata.KV)
    and `snapshots` slots of recurrent state, with or without KV streaming: {"total", "host_total", "kv_pages",
    "snapshots", "state_bytes", "kv_streaming", "window_slots", "regions": [(name, layer, offset, bytes,
    "device" | "host")]}."""
    cdef ModelGeometry g = model_geometry(geometry)
    cdef KvStorage storage = kv_storage(kv)
    cdef SessionLayout layout
    with nogil:
        layout = cpp_plan_session(g, context, storage, snapshots, kv_streaming)
    return layout_dict(layout)


def decode_scratch_bytes(dict geometry, int context, size_t sampler_bytes) -> int:
    """Device bytes of a decode session's scratch for `context` tokens beside the sampler's `sampler_bytes`
    (strata/decode_session.hpp)."""
    cdef ModelGeometry g = model_geometry(geometry)
    cdef size_t nbytes
    with nogil:
        nbytes = cpp_decode_scratch_bytes(g, context, sampler_bytes)
    return nbytes


def prompt_scratch_bytes(dict geometry, int chunk, int context, kv="int8", bint kv_streaming=False) -> int:
    """Device bytes of a session's prompt path scratch for chunks of `chunk` tokens and `context` tokens of KV
    in `kv`, with or without KV streaming (strata/decode_session.hpp)."""
    cdef ModelGeometry g = model_geometry(geometry)
    cdef KvStorage storage = kv_storage(kv)
    cdef size_t nbytes
    with nogil:
        nbytes = cpp_prompt_scratch_bytes(g, chunk, context, storage, kv_streaming)
    return nbytes


def sampler_workspace_bytes(int n_vocab) -> int:
    """The GPU sampler's workspace for `n_vocab` ids on the current device (CudaError without one)."""
    return cpp_sampler_workspace_bytes(n_vocab)


cdef PolicyOptions policy_options(dict policy) except *:
    """The native replacement options from {"replace", "admit_after", "window", "max_copies"} (missing keys keep
    the native defaults: no replacement)."""
    unknown = sorted(policy.keys() - {"replace", "admit_after", "window", "max_copies"})
    if unknown:
        raise InvalidArgument(f"expert cache policy: unknown {', '.join(unknown)} (replace, admit_after, window, "
                              "max_copies)")
    cdef PolicyOptions o
    o.replace = policy.get("replace", o.replace)
    o.admit_after = policy.get("admit_after", o.admit_after)
    o.window = policy.get("window", o.window)
    o.max_copies = policy.get("max_copies", o.max_copies)
    return o


cdef class ReplacementPolicy:
    """The expert cache's replacement alone (strata/expert_policy.hpp), on the host: what a routing trace makes
    the cache hold. plan() returns the moves [(layer, slot, expert, evicted)] a token's end begins."""
    cdef unique_ptr[CppReplacementPolicy] policy

    def __cinit__(self, list slots, int n_expert, dict policy):
        cdef vector[int] counts = slots
        self.policy.reset(new CppReplacementPolicy(counts, n_expert, policy_options(policy)))

    def hold(self, int layer, experts) -> None:
        cdef vector[int] ids = [int(e) for e in experts]
        self.policy.get().hold(layer, ids)

    def note(self, int layer, ids) -> int:
        cdef const int32_t[::1] view = np.ascontiguousarray(ids, dtype=np.int32)
        return self.policy.get().note(layer, &view[0], view.shape[0]) if view.shape[0] else 0

    def plan(self) -> list:
        return [(m.layer, m.slot, m.expert, m.evicted) for m in self.policy.get().plan()]

    def complete(self, tuple move) -> None:
        cdef ExpertMove m
        m.layer, m.slot, m.expert, m.evicted = move
        self.policy.get().complete(m)

    def slot_of(self, int layer, int expert) -> int:
        return self.policy.get().slot_of(layer, expert)


cdef class ExpertCache:
    """Routed experts held in VRAM (strata/expert_cache.hpp): `slots[l]` of layer l's experts, copied from the
    pool's host weights by hold(), and with policy {"replace": True, ...} replaced as routing moves. Keeps
    `pool` and `host_weights` (the arrays the pool's planes point into: strata.runtime.pool.ExpertPool
    .host_weights()) alive while it lives: replacement copies from them, and pins their pages until the cache
    is gone."""

    def __cinit__(self, CpuExpertPool pool, list slots, int device=0, dict policy=None, *, host_weights):
        cdef vector[int] counts = slots
        cdef CppExpertPool* native_pool = pool.native()
        cdef PolicyOptions options = policy_options(policy or {})
        self.pool, self.host_weights = pool, host_weights
        with nogil:
            self.cache.reset(new CppExpertCache(device, native_pool[0], counts, options))

    def __dealloc__(self):
        with nogil:
            self.cache.reset()

    @staticmethod
    def bytes_for(CpuExpertPool pool, list slots) -> int:
        """Bytes a cache of `slots` per layer would allocate for `pool`'s layers."""
        cdef vector[int] counts = slots
        return cpp_expert_cache_bytes(pool.native()[0], counts)

    def hold(self, int layer, experts) -> None:
        """Copy `experts` (distinct ids, at most the layer's slots) into layer `layer`'s slots, in order."""
        cdef vector[int] ids = [int(e) for e in experts]
        with nogil:
            self.cache.get().hold(layer, ids)

    def held(self, int layer) -> list:
        """The expert in each slot of `layer` (-1: empty)."""
        return list(self.cache.get().held(layer))

    def slots(self, int layer) -> int:
        return self.cache.get().slots(layer)

    def holds(self, int layer, int expert) -> bool:
        return self.cache.get().holds(layer, expert)

    def holds_all(self, int layer) -> bool:
        return self.cache.get().holds_all(layer)

    @property
    def layers(self) -> int:
        return self.cache.get().layers()

    @property
    def bytes(self) -> int:
        return self.cache.get().bytes()

    @property
    def device(self) -> int:
        return self.cache.get().device()


cdef class ExpertStaging:
    """The prompt path's VRAM staging for routed experts (strata/expert_staging.hpp): two buffers of `slots`
    experts each, refilled per chunk from the pool's host weights, whose pages it locks while it lives. Keeps
    `pool` and `host_weights` (strata.runtime.pool.ExpertPool.host_weights()) alive."""

    def __cinit__(self, CpuExpertPool pool, int slots, int device=0, *, host_weights):
        cdef CppExpertPool* native_pool = pool.native()
        self.pool, self.host_weights = pool, host_weights
        with nogil:
            self.staging.reset(new CppExpertStaging(device, native_pool[0], slots))

    def __dealloc__(self):
        with nogil:
            self.staging.reset()

    @staticmethod
    def bytes_for(CpuExpertPool pool, int slots) -> int:
        """Bytes a staging of `slots` experts per buffer would allocate for `pool`'s layers."""
        return cpp_expert_staging_bytes(pool.native()[0], slots)

    @property
    def slots(self) -> int:
        return self.staging.get().slots()

    @property
    def bytes(self) -> int:
        return self.staging.get().bytes()

    @property
    def device(self) -> int:
        return self.staging.get().device()


cdef SamplingValues sampling_values(tuple params) except *:
    """params = (temperature, top_k, top_p, min_p, repeat_penalty)."""
    cdef SamplingValues v
    v.temperature, v.top_k, v.top_p, v.min_p, v.repeat_penalty = params
    return v


cdef class DecodeSession:
    """One sequence decoding on the GPU and the CPU expert pool (strata/decode_session.hpp).

    Keeps `weights`, `pool`, `cache`, `staging` and `ple` alive while it lives. `step` feeds one token and returns
    the sampled next one; `feed` runs a prompt through the prompt path (chunks of `prompt_chunk` tokens, 0: none).
    The experts `cache` (an ExpertCache, or None) holds run on the GPU; the prompt path computes the others from
    `staging` (an ExpertStaging). With `defer_experts` d > 0, the pool's d lightest routed experts of a layer
    reach the streams a layer late (docs/session.md, "Expert deferral"). With `ple` (a PleGather) the session
    gathers every token's PLE rows itself, on its host loop, and keeps the gather's n-gram state with its own
    (reset, snapshot, restore): step and feed then take None for ple_rows.
    """

    def __cinit__(self, DeviceWeights weights, CpuExpertPool pool, dict geometry, *, int context, kv,
                  mode=Mode.TOKEN_GRAPH, int device=0, double timeout=5.0, int snapshots=0,
                  ExpertCache cache=None, int prompt_chunk=0, ExpertStaging staging=None, bint prompt_cpu=True,
                  bint kv_streaming=False, int defer_experts=0, PleGather ple=None):
        cdef ModelGeometry g = model_geometry(geometry)
        cdef DecodeOptions o
        o.device, o.context, o.timeout_seconds, o.snapshots = device, context, timeout, snapshots
        o.prompt_chunk, o.prompt_cpu, o.kv_streaming = prompt_chunk, prompt_cpu, kv_streaming
        o.defer_experts = defer_experts
        o.kv = kv_storage(kv)
        o.mode = decode_mode(mode)
        cdef CppExpertPool* native_pool = pool.native()
        cdef CppExpertCache* native_cache = cache.cache.get() if cache is not None else NULL
        cdef CppExpertStaging* native_staging = staging.staging.get() if staging is not None else NULL
        cdef CppPleGather* native_ple = ple.gather.get() if ple is not None else NULL
        self.weights, self.pool, self.cache, self.staging, self.ple = weights, pool, cache, staging, ple
        self.n_vocab = g.n_vocab
        self.ple_width = g.ple_n_heads * g.ple_head_dim if g.ple_layer >= 0 else 0
        with nogil:
            self.session.reset(new CppDecodeSession(weights.weights.get()[0], native_pool[0], g, o, native_cache,
                                                    native_staging, native_ple))

    def __dealloc__(self):
        with nogil:
            self.session.reset()

    cdef CppDecodeSession* native(self) except NULL:
        if not self.session:
            raise InvalidArgument("the decode session is closed")
        return self.session.get()

    def step(self, int token, ple_rows, tuple params, double u, bint sample=True) -> int:
        """Feed `token`; with `sample`, the next token for the draw u under params = (temperature, top_k,
        top_p, min_p, repeat_penalty), else -1. ple_rows: float32 [ple heads, ple head dim], or None (a model
        without PLE, or a session that gathers them)."""
        cdef CppDecodeSession* s = self.native()
        cdef SamplingValues v = sampling_values(params)
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

    def feed(self, tokens, ple_rows, tuple params, double u, bint sample=True, logits=None) -> int:
        """Feed the ids `tokens` through the prompt path; with `sample`, the next token as step() samples it,
        else -1. ple_rows: float32 [len(tokens), ple heads, ple head dim] or None. `logits` (a C-contiguous
        float32 array [len(tokens), n_vocab], or None) receives every position's logits."""
        cdef CppDecodeSession* s = self.native()
        cdef SamplingValues v = sampling_values(params)
        cdef const int[::1] ids = np.ascontiguousarray(tokens, dtype=np.intc).reshape(-1)
        if ids.shape[0] == 0:
            raise InvalidArgument("feed() needs at least one token id")
        cdef const float[::1] rows
        cdef const float* rows_ptr = NULL
        if ple_rows is not None:
            rows = np.ascontiguousarray(ple_rows, dtype=np.float32).reshape(-1)
            if rows.shape[0] != self.ple_width * ids.shape[0]:
                raise InvalidArgument(f"ple_rows has {rows.shape[0]} values; {ids.shape[0]} tokens of this model's "
                                      f"PLE rows hold {self.ple_width * ids.shape[0]}")
            rows_ptr = &rows[0]
        cdef float[:, ::1] every
        cdef float* logits_ptr = NULL
        if logits is not None:
            every = logits
            if every.shape[0] != ids.shape[0] or every.shape[1] != self.n_vocab:
                raise InvalidArgument(f"logits has shape ({every.shape[0]}, {every.shape[1]}); {ids.shape[0]} "
                                      f"tokens of this model's logits are ({ids.shape[0]}, {self.n_vocab})")
            logits_ptr = &every[0, 0]
        cdef int out
        with nogil:
            out = s.feed(&ids[0], ids.shape[0], rows_ptr, v, u, sample, logits_ptr)
        return out

    @property
    def prompt_chunk(self) -> int:
        return self.native().prompt_chunk()

    def logits(self):
        """float32 [n_vocab] of the last step."""
        cdef CppDecodeSession* s = self.native()
        out = np.empty(self.n_vocab, np.float32)
        cdef float[::1] view = out
        with nogil:
            s.logits(&view[0])
        return out

    def reset(self) -> None:
        cdef CppDecodeSession* s = self.native()
        with nogil:
            s.reset()

    def logprobs(self, int token, int n):
        """(log p(token), [(id, log p)] of the n most likely ids) at the last step's position, computed on the
        device as strata.sampling.log_probabilities defines them."""
        cdef CppDecodeSession* s = self.native()
        cdef TokenLogprobs out
        with nogil:
            out = s.logprobs(token, n)
        return out.token, [(out.ids[i], out.values[i]) for i in range(n)]

    def snapshot(self, int slot) -> None:
        """Keep the sequence so far (its recurrent state and position) in slot `slot`."""
        cdef CppDecodeSession* s = self.native()
        with nogil:
            s.snapshot(slot)

    def restore(self, int slot) -> None:
        """Back to the sequence kept in slot `slot`."""
        cdef CppDecodeSession* s = self.native()
        with nogil:
            s.restore(slot)

    @property
    def position(self) -> int:
        return self.native().position()

    @property
    def context(self) -> int:
        return self.native().context()

    @property
    def mode(self) -> Mode:
        cdef DecodeMode mode = self.native().mode()
        return next(m for m, native in _DECODE_MODES.items() if native == mode)

    @property
    def captured(self) -> bool:
        return self.native().captured()

    def stats(self) -> dict:
        cdef DecodeStats st = self.native().stats()
        return {"tokens": st.tokens, "seconds": st.seconds, "ring_wait_seconds": st.ring_wait_seconds,
                "pool_seconds": st.pool_seconds, "rings": st.rings, "gpu_pre_seconds": st.gpu_pre_seconds,
                "gpu_post_seconds": st.gpu_post_seconds, "expert_hits": list(st.expert_hits),
                "expert_misses": list(st.expert_misses), "expert_copies": list(st.expert_copies),
                "expert_copy_bytes": st.expert_copy_bytes, "prompt_tokens": st.prompt_tokens,
                "prompt_chunks": st.prompt_chunks, "prompt_seconds": st.prompt_seconds,
                "prompt_staged_experts": st.prompt_staged_experts,
                "prompt_cached_experts": st.prompt_cached_experts, "prompt_pooled_experts": st.prompt_pooled_experts,
                "prompt_staged_bytes": st.prompt_staged_bytes, "kv_stream_bytes": st.kv_stream_bytes,
                "ple_seconds": st.ple_seconds}

    def close(self) -> None:
        with nogil:
            self.session.reset()
