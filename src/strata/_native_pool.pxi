# The CPU expert pool (strata::cpu::ExpertPool). strata.pool lays the weights out and owns the arrays; this
# binding only passes addresses and sizes, which the native side validates.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uintptr_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from _native_pool cimport (
    ExpertMatrix, Isa, PhysicalCore, PoolOptions, cpp_cpu_has_avx2, cpp_cpu_has_avx512_vnni,
)


cdef extern from "strata/cpu_topology.hpp" nogil:
    vector[PhysicalCore] cpp_physical_cores "strata::cpu::physical_cores"() except +raise_strata_error


cdef extern from "strata/expert_pool.hpp" nogil:
    cdef cppclass CppExpertPool "strata::cpu::ExpertPool":
        CppExpertPool(int64_t n_embd, int64_t expert_ff, int max_k, const PoolOptions& options) except +raise_strata_error
        void set_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up,
                       const ExpertMatrix& down) except +raise_strata_error
        void run_layer(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                       int k, float* out) except +raise_strata_error
        void matvec(int layer, const string& matrix, int64_t expert, const float* x,
                    float* y) except +raise_strata_error
        const float* hidden(int slot) except +raise_strata_error
        double read_bandwidth(int64_t nbytes, int reps) except +raise_strata_error
        void close()
        int threads()
        Isa isa()
        vector[vector[int]] worker_cpus()
        vector[int] caller_cpus()
        int parked_workers()

_ISAS = {"auto": Isa.kAuto, "avx2": Isa.kAvx2, "avx512": Isa.kAvx512}
_PLANES = ("codes", "d", "sub_scales", "mins", "sub_mins")


def cpu_isa_support() -> dict:
    """Which CPU pool kernels this machine runs: {"avx2": bool, "avx512": bool} (AVX-512 means F/BW/VL/VNNI)."""
    return {"avx2": bool(cpp_cpu_has_avx2()), "avx512": bool(cpp_cpu_has_avx512_vnni())}


def cpu_physical_cores() -> list:
    """Physical cores this process may use, as (SMT sibling CPU ids, NUMA node), ordered by first CPU."""
    cores = cpp_physical_cores()
    return [(tuple(core.cpus), core.node) for core in cores]


cdef ExpertMatrix _expert_matrix(dict spec) except *:
    cdef ExpertMatrix m
    m.form = _quant_form(spec["form"])
    m.n_expert = spec["n_expert"]
    m.rows = spec["rows"]
    m.cols = spec["cols"]
    planes = spec["planes"]
    for name, plane in ((n, planes.get(n)) for n in _PLANES):
        address, nbytes = plane if plane is not None else (0, 0)
        if name == "codes":
            m.codes.data = <const void*><uintptr_t>address; m.codes.nbytes = nbytes
        elif name == "d":
            m.d.data = <const void*><uintptr_t>address; m.d.nbytes = nbytes
        elif name == "sub_scales":
            m.sub_scales.data = <const void*><uintptr_t>address; m.sub_scales.nbytes = nbytes
        elif name == "mins":
            m.mins.data = <const void*><uintptr_t>address; m.mins.nbytes = nbytes
        else:
            m.sub_mins.data = <const void*><uintptr_t>address; m.sub_mins.nbytes = nbytes
    return m


cdef class CpuExpertPool:
    """Native pool of pinned workers computing routed experts. Use strata.pool.ExpertPool, which owns the weights."""

    cdef CppExpertPool* pool
    cdef readonly long n_embd
    cdef readonly long expert_ff
    cdef readonly int max_k

    def __cinit__(self, long n_embd, long expert_ff, int max_k, int threads=0, bint smt=False,
                  bint pin_caller=True, str isa="auto", int spin_us=3000):
        if isa not in _ISAS:
            raise InvalidArgument(f"isa must be one of {sorted(_ISAS)}, found {isa!r}")
        cdef PoolOptions options
        options.threads = threads
        options.smt = smt
        options.pin_caller = pin_caller
        options.isa = _ISAS[isa]
        options.spin_us = spin_us
        self.pool = new CppExpertPool(n_embd, expert_ff, max_k, options)
        self.n_embd, self.expert_ff, self.max_k = n_embd, expert_ff, max_k

    def __dealloc__(self):
        if self.pool != NULL:
            del self.pool
            self.pool = NULL

    def set_layer(self, int layer, dict gate, dict up, dict down):
        """Registers one layer's experts: each matrix a dict of form fields, shape and plane (address, nbytes)."""
        cdef ExpertMatrix g = _expert_matrix(gate), u = _expert_matrix(up), d = _expert_matrix(down)
        with nogil:
            self.pool.set_layer(layer, g, u, d)

    def run_layer(self, int layer, x, ids, weights, skip, out):
        """out[j] = weights[j] * expert ids[j] (x) for every j with skip[j] == 0; other rows of out untouched."""
        cdef const float[::1] xv = x
        cdef const int32_t[::1] iv = ids
        cdef const float[::1] wv = weights
        cdef const uint8_t[::1] sv = skip
        cdef float[:, ::1] ov = out
        cdef int k = iv.shape[0]
        if xv.shape[0] != self.n_embd:
            raise InvalidArgument(f"run_layer: x has {xv.shape[0]} entries, n_embd is {self.n_embd}")
        if wv.shape[0] != k or sv.shape[0] != k or ov.shape[0] != k or ov.shape[1] != self.n_embd:
            raise InvalidArgument(
                f"run_layer: ids has {k} entries; weights {wv.shape[0]}, skip {sv.shape[0]} and out "
                f"{ov.shape[0]}x{ov.shape[1]} must be {k}, {k} and {k}x{self.n_embd}")
        if k == 0:
            return
        with nogil:
            self.pool.run_layer(layer, &xv[0], &iv[0], &wv[0], &sv[0], k, &ov[0, 0])

    def matvec(self, int layer, str matrix, long expert, x):
        """y = W x for one expert's registered matrix, on the calling thread (test hook for the dot kernels)."""
        cdef const float[::1] xv = x
        cdef string name = matrix.encode()
        rows, cols = (self.n_embd, self.expert_ff) if matrix == "down" else (self.expert_ff, self.n_embd)
        if xv.shape[0] != cols:
            raise InvalidArgument(f"matvec: x has {xv.shape[0]} entries, {matrix} has {cols} columns")
        y = np.empty(rows, np.float32)
        cdef float[::1] yv = y
        with nogil:
            self.pool.matvec(layer, name, expert, &xv[0], &yv[0])
        return y

    def hidden(self, int slot):
        """A copy of h = silu(gate x) * up x of slot `slot` from the last run_layer."""
        cdef const float* h = self.pool.hidden(slot)
        return np.asarray(<float[:self.expert_ff]><float*>h).copy()

    def read_bandwidth(self, long nbytes, int reps=5) -> float:
        """Best bytes/s of all workers reading an nbytes buffer (each worker its own first-touched slice)."""
        cdef double bw
        with nogil:
            bw = self.pool.read_bandwidth(nbytes, reps)
        return bw

    def close(self):
        """Stops the workers and restores the constructing thread's CPU affinity."""
        with nogil:
            self.pool.close()

    @property
    def threads(self) -> int:
        return self.pool.threads()

    @property
    def isa(self) -> str:
        return "avx512" if self.pool.isa() == Isa.kAvx512 else "avx2"

    @property
    def worker_cpus(self) -> list:
        return [tuple(c) for c in self.pool.worker_cpus()]

    @property
    def caller_cpus(self) -> tuple:
        return tuple(self.pool.caller_cpus())

    @property
    def parked_workers(self) -> int:
        return self.pool.parked_workers()
