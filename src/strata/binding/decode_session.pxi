# One sequence decoding on the GPU and the CPU pool, and the scratch it needs
# (strata/decode_session.hpp).
from libc.stdint cimport int32_t, uint8_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata.libstrata.decode_session cimport (
    DecodeOptions, DecodeStats, SamplingValues, StepPart, TokenLogprobs, cpp_decode_scratch_bytes,
    cpp_prompt_prefetch_rows, cpp_prompt_scratch_bytes, cpp_sampler_workspace_bytes, kMaxStepRows,
    kMaxVerifyRows,
)

MAX_VERIFY_ROWS = kMaxVerifyRows  # the most tokens one verification step takes
MAX_STEP_ROWS = kMaxStepRows  # the most rows a step of several rows takes: a batch's sessions, a verify's rows

_DECODE_MODES = {Mode.UNCAPTURED: DecodeMode.kUncaptured, Mode.LAYER_GRAPHS: DecodeMode.kLayerGraphs,
                 Mode.TOKEN_GRAPH: DecodeMode.kTokenGraph}


cdef DecodeMode decode_mode(object mode) except *:
    return _DECODE_MODES[Mode.parse(mode)]


def prompt_prefetch_rows(dict geometry) -> int:
    """The prompt path's rows rule (strata/decode_session.hpp): a chunk of at least this many routed rows copies
    whole layers ahead; a smaller one may give the CPU pool a share, which needs a pool of this many max_rows."""
    return cpp_prompt_prefetch_rows(model_geometry(geometry))


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


cdef SamplingValues sampling_values(tuple params, list held) except *:
    """params = (temperature, top_k, top_p, min_p, repeat_penalty), or those and (frequency_penalty,
    presence_penalty, answer_start, logit_bias, token_mask), and optionally mask_ticket: logit_bias (token id, bias)
    pairs, token_mask whether the session's token_mask_words() hold this draw's mask, mask_ticket (step() only) the
    ticket the caller publishes once it has written them while the step runs (0: written before the call). The
    bias's arrays go into `held`, which the caller keeps until the native call returns."""
    cdef SamplingValues v
    cdef const int[::1] ids
    cdef const float[::1] values
    if len(params) == 5:
        v.temperature, v.top_k, v.top_p, v.min_p, v.repeat_penalty = params
        return v
    if len(params) not in (10, 11):
        raise InvalidArgument(f"sampling values are 5, 10 or 11 numbers and flags, got {len(params)}")
    (v.temperature, v.top_k, v.top_p, v.min_p, v.repeat_penalty, v.frequency_penalty, v.presence_penalty,
     v.answer_start, bias, v.token_mask) = params[:10]
    if len(params) == 11:
        v.mask_ticket = params[10]
    if bias:
        pairs = np.asarray(bias, np.float64).reshape(-1, 2)
        id_array = np.ascontiguousarray(pairs[:, 0], dtype=np.intc)
        value_array = np.ascontiguousarray(pairs[:, 1], dtype=np.float32)  # strata.sampling's float32 cast
        held.append((id_array, value_array))
        ids, values = id_array, value_array
        v.bias_ids, v.bias_values, v.n_bias = &ids[0], &values[0], ids.shape[0]
    return v


cdef const int[::1] token_ids(tokens) except *:
    cdef const int[::1] ids = np.ascontiguousarray(tokens, dtype=np.intc).reshape(-1)
    if ids.shape[0] == 0:
        raise InvalidArgument("a prompt chunk needs at least one token id")
    return ids


def step_batch(sessions, tokens, ple_rows, params, us, bint sample=True) -> list:
    """One decode step of every DecodeSession in `sessions` at once (DecodeSession::step_batch): sessions[i] feeds
    tokens[i] (ple_rows[i] as step's, or ple_rows None for all) and, with `sample`, returns its next token for the
    draw us[i] under params[i] (as step's), else -1. The rows run on the prompt path of the session made first."""
    cdef int n = len(sessions)
    if not (len(tokens) == len(params) == len(us) == n) or (ple_rows is not None and len(ple_rows) != n):
        raise InvalidArgument(f"a batched step takes one token, sampling, draw (and PLE rows) per session: "
                              f"{n} sessions, {len(tokens)} tokens, {len(params)} samplings, {len(us)} draws")
    if n == 0:
        raise InvalidArgument("a batched step needs at least one session")
    cdef vector[CppDecodeSession*] natives
    cdef vector[int] ids
    cdef vector[const float*] rows
    cdef vector[SamplingValues] values
    cdef vector[double] draws
    cdef vector[int] out = vector[int](n)
    cdef DecodeSession session
    cdef int i
    held = []  # the bias arrays the native call reads
    for i in range(n):
        session = sessions[i]
        natives.push_back(session.native())
        ids.push_back(tokens[i])
        rows.push_back(session.rows_of(ple_rows[i] if ple_rows is not None else None, 1))
        values.push_back(sampling_values(params[i], held))
        draws.push_back(us[i])
    with nogil:
        CppDecodeSession.step_batch(natives.data(), n, ids.data(), rows.data(), values.data(), draws.data(), sample,
                                    out.data())
    return list(out)


def step_rows(sessions, tokens, ple_rows, verify, params, us, logits) -> list:
    """One step of several sessions' rows (DecodeSession::step_rows, docs/rows.md): sessions[i] appends the ids
    tokens[i]. Where verify[i], that is a verification of 1..verify_rows ids, every row's logits into logits[i]
    (C-contiguous float32 [len(tokens[i]), n_vocab]; None: the first rows of its verified_rows()) and -1 returned
    for it; else one id, stepped and sampled
    under params[i] and the draw us[i] as step's, its token returned. ple_rows: None, or per session None or its
    rows as step's and verify's. The rows run on the prompt path of the session made first."""
    cdef int n = len(sessions)
    if not (len(tokens) == len(verify) == len(params) == len(us) == len(logits) == n) or (
            ple_rows is not None and len(ple_rows) != n):
        raise InvalidArgument(f"a step of several sessions' rows takes ids, a verify flag, sampling, a draw, logits "
                              f"(and PLE rows) per session: {n} sessions, {len(tokens)} id lists, {len(verify)} "
                              f"flags, {len(params)} samplings, {len(us)} draws, {len(logits)} logits")
    if n == 0:
        raise InvalidArgument("a step of several sessions' rows needs at least one session")
    cdef vector[CppDecodeSession*] natives
    cdef vector[StepPart] parts = vector[StepPart](n)
    cdef DecodeSession session
    cdef const int[::1] ids
    cdef int i
    held = []  # the ids the native call reads
    for i in range(n):
        session = sessions[i]
        natives.push_back(session.native())
        ids = token_ids(tokens[i])
        held.append(ids)
        parts[i].tokens = &ids[0]
        parts[i].count = ids.shape[0]
        parts[i].ple_rows = session.rows_of(ple_rows[i] if ple_rows is not None else None, ids.shape[0])
        parts[i].verify = bool(verify[i])
        parts[i].sample = not parts[i].verify
        if parts[i].verify:
            rows_out = session.verify_out(logits[i], ids.shape[0])
            held.append(rows_out)
            parts[i].logits = <float*>NULL if rows_out is None else session.logits_of(rows_out, ids.shape[0])
        parts[i].sampling = sampling_values(params[i], held)
        parts[i].u = us[i]
    with nogil:
        CppDecodeSession.step_rows(natives.data(), parts.data(), n)
    return [parts[i].sampled for i in range(n)]


cdef class DecodeSession:
    """One sequence decoding on the GPU and the CPU expert pool (strata/decode_session.hpp).

    Keeps `weights`, `pool`, `cache`, `staging` and `ple` alive while it lives. `step` feeds one token and returns
    the sampled next one; `feed` runs a prompt through the prompt path (chunks of `prompt_chunk` tokens, 0: none).
    The experts `cache` (an ExpertCache, or None) holds run on the GPU; the prompt path computes the others from
    `staging` (an ExpertStaging). With `defer_experts` d > 0, the pool's d lightest routed experts of a layer
    reach the streams a layer late (docs/session.md, "Expert deferral"). With `ple` (a PleGather) the session
    gathers every token's PLE rows itself, on its host loop, and keeps the gather's n-gram state with its own
    (reset, snapshot, restore): step and feed then take None for ple_rows. With `verify_rows` r > 0, `verify`
    runs up to r tokens at once keeping each row's state, and `truncate` cuts back to any of them
    (docs/speculative.md).
    """

    def __cinit__(self, DeviceWeights weights, CpuExpertPool pool, dict geometry, *, int context, kv,
                  mode=Mode.TOKEN_GRAPH, int device=0, double timeout=5.0, int snapshots=0,
                  ExpertCache cache=None, int prompt_chunk=0, ExpertStaging staging=None, bint prompt_cpu=True,
                  bint kv_streaming=False, int defer_experts=0, PleGather ple=None, int verify_rows=0):
        cdef ModelGeometry g = model_geometry(geometry)
        cdef DecodeOptions o
        o.device, o.context, o.timeout_seconds, o.snapshots = device, context, timeout, snapshots
        o.prompt_chunk, o.prompt_cpu, o.kv_streaming = prompt_chunk, prompt_cpu, kv_streaming
        o.defer_experts, o.verify_rows = defer_experts, verify_rows
        o.kv = kv_storage(kv)
        o.mode = decode_mode(mode)
        cdef CppExpertPool* native_pool = pool.native()
        cdef CppExpertCache* native_cache = cache.cache.get() if cache is not None else NULL
        cdef CppExpertStaging* native_staging = staging.staging.get() if staging is not None else NULL
        cdef CppPleGather* native_ple = ple.gather.get() if ple is not None else NULL
        self.weights, self.pool, self.cache, self.staging, self.ple = weights, pool, cache, staging, ple
        self.n_vocab, self.n_layer, self.n_embd = g.n_vocab, g.n_layer, g.n_embd
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
        top_p, min_p, repeat_penalty), or those and (frequency_penalty, presence_penalty, answer_start, logit_bias,
        token_mask) (sampling_values), else -1. ple_rows: float32 [ple heads, ple head dim], or None (a model
        without PLE, or a session that gathers them)."""
        cdef CppDecodeSession* s = self.native()
        held = []
        cdef SamplingValues v = sampling_values(params, held)
        cdef const float* rows_ptr = self.rows_of(ple_rows, 1)
        cdef int out
        with nogil:
            out = s.step(token, rows_ptr, v, u, sample)
        return out

    def feed(self, tokens, ple_rows, tuple params, double u, bint sample=True, logits=None) -> int:
        """Feed the ids `tokens` through the prompt path; with `sample`, the next token as step() samples it,
        else -1. ple_rows: float32 [len(tokens), ple heads, ple head dim] or None. `logits` (a C-contiguous
        float32 array [len(tokens), n_vocab], or None) receives every position's logits."""
        cdef CppDecodeSession* s = self.native()
        held = []
        cdef SamplingValues v = sampling_values(params, held)
        cdef const int[::1] ids = token_ids(tokens)
        cdef const float* rows_ptr = self.rows_of(ple_rows, ids.shape[0])
        cdef float* logits_ptr = NULL
        if logits is not None:
            logits_ptr = self.logits_of(logits, ids.shape[0])
        cdef int out
        with nogil:
            out = s.feed(&ids[0], ids.shape[0], rows_ptr, v, u, sample, logits_ptr)
        return out

    def verify(self, tokens, ple_rows, logits=None):
        """A verification step: the ids `tokens` (at most verify_rows) through the prompt path as one chunk, every
        position's logits into `logits` (C-contiguous float32 [len(tokens), n_vocab]; None: the first rows of
        verified_rows()), each row's state kept for `truncate`. ple_rows as feed's. Returns the logits."""
        cdef CppDecodeSession* s = self.native()
        cdef const int[::1] ids = token_ids(tokens)
        cdef const float* rows_ptr = self.rows_of(ple_rows, ids.shape[0])
        logits = self.verify_out(logits, ids.shape[0])
        cdef float* logits_ptr = <float*>NULL if logits is None else self.logits_of(logits, ids.shape[0])
        with nogil:
            s.verify(&ids[0], ids.shape[0], rows_ptr, logits_ptr)
        return logits

    cdef object verify_out(self, logits, int n):
        """Where a verification of n ids puts its rows: `logits`, else the first n of verified_rows(); None where
        that block is too small (more ids than verify_rows: the native call refuses the count, naming its limit,
        before it would read a buffer)."""
        if logits is not None:
            return logits
        block = self.verified_rows()
        return block[:n] if n <= block.shape[0] else None

    def verified_rows(self):
        """float32 [max(verify_rows, 1), n_vocab] of page-locked memory (made on first use): where verify() and
        step_rows() put a verification's rows when given no array, copied there at the bus's rate (a pageable array
        takes several times longer). Each verification of this session overwrites them."""
        if self.verified is None:
            self.verified = np.asarray(PinnedFloats(max(self.native().verify_rows(), 1), self.n_vocab))
        return self.verified

    def truncate(self, int position) -> None:
        """Right after verify: back to the sequence's state after `position` tokens (one of the verified ones)."""
        cdef CppDecodeSession* s = self.native()
        with nogil:
            s.truncate(position)

    @property
    def verify_rows(self) -> int:
        return self.native().verify_rows()

    def set_control_vectors(self, table, layers) -> None:
        """The control vectors from the next step on (docs/control_vectors.md): `table` float32 [n_layer, n_embd], row l
        added to every residual stream after layer l's last write where `layers` [n_layer] (bools) is true; all
        false: none. strata.runtime.steering.ControlVectors.staged makes both from a {layer: vector} table."""
        cdef CppDecodeSession* s = self.native()
        t = np.ascontiguousarray(table, dtype=np.float32)
        m = np.ascontiguousarray(layers, dtype=np.uint8)
        if t.shape != (self.n_layer, self.n_embd) or m.shape != (self.n_layer,):
            raise InvalidArgument(f"control vectors take a table of shape ({self.n_layer}, {self.n_embd}) and "
                                  f"{self.n_layer} layer flags, got {t.shape} and {m.shape}")
        cdef const float[:, ::1] tv = t
        cdef const uint8_t[::1] mv = m
        with nogil:
            s.set_control_vectors(&tv[0, 0], &mv[0])

    @property
    def control_vector_layers(self) -> list:
        """The layers whose control vector the session adds now."""
        return list(self.native().control_vector_layers())

    def layer_states(self, tokens, ple_rows):
        """Feed the ids `tokens` through the prompt path (nothing sampled) and return float32 [n_layer, n_embd]: each
        layer's output at the last of them, the mean of its residual streams (`strata cvector`'s measure). ple_rows
        as feed's."""
        cdef CppDecodeSession* s = self.native()
        cdef const int[::1] ids = token_ids(tokens)
        cdef const float* rows_ptr = self.rows_of(ple_rows, ids.shape[0])
        out = np.empty((self.n_layer, self.n_embd), np.float32)
        cdef float[:, ::1] ov = out
        with nogil:
            s.layer_states(&ids[0], ids.shape[0], rows_ptr, &ov[0, 0])
        return out

    cdef const float* rows_of(self, ple_rows, int n) except? NULL:
        """ple_rows (float32 [n, ple heads, ple head dim] or None) as the native call takes them, checked."""
        if ple_rows is None:
            return NULL
        rows = np.ascontiguousarray(ple_rows, dtype=np.float32).reshape(-1)
        if rows.shape[0] != self.ple_width * n:
            raise InvalidArgument(f"ple_rows has {rows.shape[0]} values; {n} tokens of this model's "
                                  f"PLE rows hold {self.ple_width * n}")
        self.held_rows = rows  # the native call reads them: alive until the next call's replace them
        cdef const float[::1] view = rows
        return &view[0]

    cdef float* logits_of(self, logits, int n) except NULL:
        """`logits` (C-contiguous float32 [n, n_vocab]) as the native call writes them, checked."""
        cdef float[:, ::1] every = logits
        if every.shape[0] != n or every.shape[1] != self.n_vocab:
            raise InvalidArgument(f"logits has shape ({every.shape[0]}, {every.shape[1]}); {n} "
                                  f"tokens of this model's logits are ({n}, {self.n_vocab})")
        return &every[0, 0]

    @property
    def prompt_chunk(self) -> int:
        return self.native().prompt_chunk()

    @property
    def batch_key(self) -> str | None:
        """Which sessions may step together (step_batch): those of equal keys; None where this one steps with none
        (no prompt path, or its KV streams)."""
        cdef string key = self.native().batch_key()
        return key.decode() if key.size() else None

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

    def logprobs(self, int token, int n, bint token_mask=False):
        """(log p(token), [(id, log p)] of the n most likely ids) at the last step's position, computed on the
        device as strata.sampling.log_probabilities defines them; with `token_mask`, over the tokens
        token_mask_words() allow (`token` one of them, n at most their count)."""
        cdef CppDecodeSession* s = self.native()
        cdef TokenLogprobs out
        with nogil:
            out = s.logprobs(token, n, token_mask)
        return out.token, [(out.ids[i], out.values[i]) for i in range(n)]

    def token_mask_words(self):
        """int32 [(n_vocab + 31) / 32]: the token mask of the next draw whose sampling values set token_mask, in the
        session's page-locked memory that the sampler reads (strata.sampling.TokenMask's layout; TokenMask.fill
        writes it in place). Valid while the session is open."""
        cdef CppDecodeSession* s = self.native()
        cdef int32_t[::1] words
        if self.mask_words is None:
            words = <int32_t[:s.token_mask_size()]> s.token_mask_words()
            self.mask_words = np.asarray(words)
        return self.mask_words

    def publish_token_mask(self, unsigned ticket) -> None:
        """The draw of `ticket` (a step's mask_ticket) has its words in token_mask_words(): its sampler, waiting for
        them, goes on. Any thread may call it while the step runs (it takes no lock and never blocks)."""
        self.native().publish_token_mask(ticket)

    def check_token_mask(self) -> None:
        """InvalidArgument unless token_mask_words() allow some token of the vocabulary (what a step refuses before
        it runs where the mask was written before it)."""
        self.native().check_token_mask()

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
        """The session's sums since construction or reset: every field of strata::DecodeStats, by its C++ name."""
        cdef DecodeStats st = self.native().stats()
        return st

    def close(self) -> None:
        self.mask_words = None  # its memory goes with the native session
        with nogil:
            self.session.reset()
