# The session room: the GPU <-> CPU expert exchange (cuda/include/strata/exchange_check.hpp) and the
# model's dense weights in VRAM (cuda/include/strata/device_weights.hpp).
from libc.stdint cimport int32_t, int64_t
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

cdef extern from "strata/exchange_check.hpp" nogil:
    cdef enum class ExchangeMode "strata::exchange_check::Mode":
        kUncaptured
        kLayerGraphs
        kTokenGraph

    cdef cppclass ExchangeFaults "strata::exchange_check::Faults":
        int never_ring_layer
        int never_answer_layer

    cdef cppclass ExchangeTiming "strata::exchange_check::Timing":
        double seconds_per_token
        double ring_wait_seconds
        double pool_seconds
        long rings

    ExchangeTiming cpp_exchange_run "strata::exchange_check::run"(
        CppExpertPool& pool, int device, ExchangeMode mode, int n_layer, int n, int k, const float* x,
        const int32_t* ids, const float* weights, int tokens, float* out, const ExchangeFaults& faults,
        double timeout_seconds) except +raise_strata_error


_EXCHANGE_MODES = {"uncaptured": 0, "layer_graphs": 1, "token_graph": 2}


def expert_exchange(CpuExpertPool pool, str mode, x, ids, weights, int tokens, *, int device=0,
                    int never_ring_layer=-1, int never_answer_layer=-1, double timeout=2.0):
    """Run `tokens` tokens of the per-layer GPU <-> CPU expert exchange in `mode`.

    x: float32 [n_layer, n]; ids: int32 [n_layer, k]; weights: float32 [n_layer, k]. For token t the GPU
    publishes x[l] * (t + 1). Returns (out float32 [tokens, n_layer, n], timing dict).
    """
    if mode not in _EXCHANGE_MODES:
        raise InvalidArgument(f"unknown exchange mode {mode!r}; choose one of {', '.join(_EXCHANGE_MODES)}")
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef const int32_t[:, ::1] iv = np.ascontiguousarray(ids, dtype=np.int32)
    cdef const float[:, ::1] wv = np.ascontiguousarray(weights, dtype=np.float32)
    cdef int n_layer = xv.shape[0], n = xv.shape[1], k = iv.shape[1]
    if iv.shape[0] != n_layer or wv.shape[0] != n_layer or wv.shape[1] != k:
        raise InvalidArgument(f"ids {iv.shape[0]}x{iv.shape[1]} and weights {wv.shape[0]}x{wv.shape[1]} must "
                              f"both be n_layer x k = {n_layer}x{k}")
    if tokens < 1:
        raise InvalidArgument(f"tokens must be >= 1, got {tokens}")
    out = np.full((tokens, n_layer, n), np.nan, dtype=np.float32)
    cdef float[:, :, ::1] ov = out
    cdef ExchangeFaults faults
    faults.never_ring_layer = never_ring_layer
    faults.never_answer_layer = never_answer_layer
    cdef ExchangeMode cmode = <ExchangeMode>_EXCHANGE_MODES[mode]
    cdef ExchangeTiming timing
    with nogil:
        timing = cpp_exchange_run(pool.pool[0], device, cmode, n_layer, n, k, &xv[0, 0], &iv[0, 0], &wv[0, 0],
                                  tokens, &ov[0, 0, 0], faults, timeout)
    return out, {"seconds_per_token": timing.seconds_per_token, "ring_wait_seconds": timing.ring_wait_seconds,
                 "pool_seconds": timing.pool_seconds, "rings": timing.rings}


cdef extern from "strata/device_weights.hpp" nogil:
    cdef cppclass HostTensor "strata::HostTensor":
        string name
        bint is_float
        FloatKind float_kind
        QuantForm form
        int64_t rows
        int64_t cols
        const void* planes[5]
        size_t plane_bytes[5]

    cdef cppclass DeviceTensor "strata::DeviceTensor":
        int64_t rows
        int64_t cols

    cdef cppclass CppDeviceWeights "strata::DeviceWeights":
        CppDeviceWeights(int device, const vector[HostTensor]& tensors) except +raise_strata_error
        size_t bytes()
        bint has(const string& name)
        const DeviceTensor& get(const string& name) except +raise_strata_error


cdef extern from "strata/weights_check.hpp" nogil:
    void cpp_weights_gemv "strata::weights_check::gemv"(
        const CppDeviceWeights& weights, const string& name, const float* x, float* y) except +raise_strata_error


cdef HostTensor _host_tensor(str name, held, list keep) except *:
    """A strata.quant QuantTensor or float array (as repack returns them) as the core's HostTensor."""
    cdef HostTensor t
    t.name = name.encode()
    if isinstance(held, np.ndarray):
        if held.ndim != 2 or held.dtype not in _FLOAT_KINDS:
            raise InvalidArgument(f"tensor {name}: a float weight must be a 2-D float32/float16/uint16(bf16) "
                                  f"array, got {held.dtype} {held.shape}")
        t.is_float = True
        t.float_kind = <FloatKind>_FLOAT_KINDS[held.dtype]
        t.rows, t.cols = held.shape
        t.planes[0] = _plane_pointer(held, keep)
        t.plane_bytes[0] = held.nbytes
        return t
    t.is_float = False
    t.form = _quant_form(held.form)
    t.rows, t.cols = held.rows, held.cols
    for i, plane_name in enumerate(_PLANES):
        plane = getattr(held, plane_name)
        t.planes[i] = _plane_pointer(plane, keep)
        t.plane_bytes[i] = 0 if plane is None else plane.nbytes
    return t


cdef class DeviceWeights:
    """A model's dense weights in VRAM, in canonical forms, one allocation (strata::DeviceWeights)."""
    cdef unique_ptr[CppDeviceWeights] weights

    def __cinit__(self, dict tensors, int device=0):
        cdef vector[HostTensor] host
        keep = []
        for name, held in tensors.items():
            host.push_back(_host_tensor(name, held, keep))
        with nogil:
            self.weights.reset(new CppDeviceWeights(device, host))

    @property
    def nbytes(self) -> int:
        return self.weights.get().bytes()

    def gemv(self, str name, x):
        """W x for the uploaded tensor `name` through the decode-step GEMV kernels (a test hook)."""
        cdef string key = name.encode()
        cdef const DeviceTensor* t = &self.weights.get().get(key)
        cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
        if xv.shape[0] != t.cols:
            raise InvalidArgument(f"gemv of {name}: x has {xv.shape[0]} entries, the tensor has {t.cols} columns")
        out = np.empty(t.rows, np.float32)
        cdef float[::1] ov = out
        with nogil:
            cpp_weights_gemv(self.weights.get()[0], key, &xv[0], &ov[0])
        return out

    def __dealloc__(self):
        with nogil:
            self.weights.reset()


cdef extern from "strata/session_layout.hpp" nogil:
    cdef enum class KvStorage "strata::KvStorage":
        Bf16
        Int8

    cdef cppclass SessionShape "strata::SessionShape":
        vector[bint] recurrent
        int n_embd, n_vocab, n_head_kv, head_dim
        int ssm_k_heads, ssm_v_heads, ssm_head_k_dim, ssm_head_v_dim, ssm_conv_kernel
        int indexer_head_dim, indexer_ratio, n_ple_layers, ple_history, hc_count

    cdef cppclass LayoutRegion "strata::Region":
        string name
        int layer
        size_t offset
        size_t bytes

    cdef cppclass SessionLayout "strata::SessionLayout":
        int kv_pages
        vector[LayoutRegion] regions
        size_t total

    SessionLayout cpp_plan_session "strata::plan_session"(
        const SessionShape& shape, int context, KvStorage kv) except +raise_strata_error


_KV_STORAGE = {"bf16": 0, "int8": 1}


def session_layout(dict shape, int context, str kv) -> dict:
    """The session arena's layout (strata/session_layout.hpp): {"total", "kv_pages", "regions": [(name,
    layer, offset, bytes)]}. `shape` holds SessionShape's fields; `kv` is "bf16" or "int8"."""
    if kv not in _KV_STORAGE:
        raise InvalidArgument(f"the session arena holds KV as {' or '.join(_KV_STORAGE)}, not {kv!r}")
    cdef SessionShape s
    for flag in shape["recurrent"]:
        s.recurrent.push_back(bool(flag))
    s.n_embd, s.n_vocab = shape["n_embd"], shape["n_vocab"]
    s.n_head_kv, s.head_dim = shape["n_head_kv"], shape["head_dim"]
    s.ssm_k_heads, s.ssm_v_heads = shape["ssm_k_heads"], shape["ssm_v_heads"]
    s.ssm_head_k_dim, s.ssm_head_v_dim = shape["ssm_head_k_dim"], shape["ssm_head_v_dim"]
    s.ssm_conv_kernel = shape["ssm_conv_kernel"]
    s.indexer_head_dim, s.indexer_ratio = shape["indexer_head_dim"], shape["indexer_ratio"]
    s.n_ple_layers, s.ple_history, s.hc_count = shape["n_ple_layers"], shape["ple_history"], shape["hc_count"]
    cdef KvStorage storage = <KvStorage>_KV_STORAGE[kv]
    cdef SessionLayout layout
    with nogil:
        layout = cpp_plan_session(s, context, storage)
    return {"total": layout.total, "kv_pages": layout.kv_pages,
            "regions": [(r.name.decode(), r.layer, r.offset, r.bytes) for r in layout.regions]}


cdef extern from "strata/session_arena.hpp" nogil:
    cdef cppclass CppSessionArena "strata::SessionArena":
        CppSessionArena(int device, SessionLayout layout) except +raise_strata_error
        void reset() except +raise_strata_error
        void download(void* host) except +raise_strata_error
        void fill(unsigned char byte) except +raise_strata_error
        const SessionLayout& layout()


cdef class SessionArena:
    """One session's sequence state in VRAM (strata/session_arena.hpp)."""
    cdef unique_ptr[CppSessionArena] arena

    def __cinit__(self, dict shape, int context, str kv, int device=0):
        layout = session_layout(shape, context, kv)  # validates, names what is wrong
        cdef SessionLayout cpp_layout
        cpp_layout.kv_pages = layout["kv_pages"]
        cpp_layout.total = layout["total"]
        cdef LayoutRegion r
        for name, layer, offset, nbytes in layout["regions"]:
            r.name, r.layer, r.offset, r.bytes = name.encode(), layer, offset, nbytes
            cpp_layout.regions.push_back(r)
        with nogil:
            self.arena.reset(new CppSessionArena(device, cpp_layout))

    @property
    def layout(self) -> dict:
        cdef SessionLayout l = self.arena.get().layout()
        return {"total": l.total, "kv_pages": l.kv_pages,
                "regions": [(r.name.decode(), r.layer, r.offset, r.bytes) for r in l.regions]}

    def reset(self) -> None:
        with nogil:
            self.arena.get().reset()

    def fill(self, int byte) -> None:
        """Set every byte of the arena (a test hook: poison before proving reset)."""
        cdef unsigned char b = byte
        with nogil:
            self.arena.get().fill(b)

    def download(self):
        """The arena's bytes (a test hook)."""
        out = np.empty(self.arena.get().layout().total, np.uint8)
        cdef unsigned char[::1] view = out
        with nogil:
            self.arena.get().download(&view[0])
        return out

    def __dealloc__(self):
        with nogil:
            self.arena.reset()
