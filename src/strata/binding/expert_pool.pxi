# The CPU expert pool (strata::cpu::ExpertPool). strata.runtime.pool lays the weights out and owns the arrays;
# this binding only passes addresses and sizes, which the native side validates.
import os

from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libcpp.string cimport string

from strata.libstrata.expert_pool cimport (
    ExpertFileInfo, ExpertFileOptions, ExpertMatrix, Isa, PoolOptions, TierSizes, cpp_cpu_has_avx2,
    cpp_cpu_has_avx512_vnni,
)
from strata.libstrata.expert_tiers cimport FileMatrix, TierLayerStats, TierPolicy
from strata.libstrata.forms cimport FloatKind

_ISAS = {"auto": Isa.kAuto, "avx2": Isa.kAvx2, "avx512": Isa.kAvx512}


def cpu_isa_support() -> dict:
    """Which CPU pool kernels this machine runs: {"avx2": bool, "avx512": bool} (AVX-512 means F/BW/VL/VNNI)."""
    return {"avx2": bool(cpp_cpu_has_avx2()), "avx512": bool(cpp_cpu_has_avx512_vnni())}


cdef Isa pool_isa(str isa) except *:
    if isa not in _ISAS:
        raise InvalidArgument(f"isa must be one of {sorted(_ISAS)}, found {isa!r}")
    return _ISAS[isa]


cdef ExpertMatrix expert_matrix(dict spec) except *:
    """A matrix spec of strata.runtime.pool.matrix_spec: form, n_expert, rows, cols, planes {name: (address,
    nbytes)} (a float form's elements in "codes")."""
    from strata.quant.forms import FLOAT_DTYPES

    cdef ExpertMatrix m
    form = spec["form"]
    m.is_float = form.is_float
    if form.is_float:
        m.float_kind = <FloatKind>_FLOAT_KINDS[FLOAT_DTYPES[form.float_kind]]
    else:
        m.form = quant_form(form)
    m.n_expert = spec["n_expert"]
    m.rows = spec["rows"]
    m.cols = spec["cols"]
    planes = spec["planes"]
    for name in _PLANES:
        address, nbytes = planes.get(name) or (0, 0)
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
    """Native pool of pinned workers computing routed experts. Use strata.runtime.pool.ExpertPool, which owns the
    weights. Construction starts the workers and close() (or destruction) joins them, both without the GIL."""

    def __cinit__(self, long n_embd, long expert_ff, int max_k, int threads=0, bint smt=False,
                  bint pin_caller=True, str isa="auto", int spin_us=3000, int max_rows=0):
        cdef PoolOptions options
        options.threads = threads
        options.smt = smt
        options.pin_caller = pin_caller
        options.isa = pool_isa(isa)
        options.spin_us = spin_us
        options.max_rows = max_rows
        with nogil:
            self.pool.reset(new CppExpertPool(n_embd, expert_ff, max_k, options))
        self.n_embd, self.expert_ff, self.max_k, self.max_rows = n_embd, expert_ff, max_k, max_rows

    def __dealloc__(self):
        with nogil:
            self.pool.reset()

    cdef CppExpertPool* native(self) except NULL:
        if not self.pool:
            raise InvalidArgument("the expert pool was not created")
        return self.pool.get()

    def set_layer(self, int layer, dict gate, dict up, dict down):
        """Registers one layer's experts: each matrix a dict of form fields, shape and plane (address, nbytes)."""
        cdef CppExpertPool* pool = self.native()
        cdef ExpertMatrix g = expert_matrix(gate), u = expert_matrix(up), d = expert_matrix(down)
        with nogil:
            pool.set_layer(layer, g, u, d)

    def run_layer(self, int layer, x, ids, weights, skip, out):
        """out[j] = weights[j] * expert ids[j] (x) for every j with skip[j] == 0; other rows of out untouched."""
        cdef CppExpertPool* pool = self.native()
        cdef const float[::1] xv = x
        cdef const int32_t[::1] iv = ids
        cdef const float[::1] wv = weights
        cdef const uint8_t[::1] sv = skip
        cdef float[:, ::1] ov = out
        cdef int k = self.checked_request("run_layer", xv, iv, wv, sv)
        if ov.shape[0] != k or ov.shape[1] != self.n_embd:
            raise InvalidArgument(f"run_layer: out is {ov.shape[0]}x{ov.shape[1]}, must be {k}x{self.n_embd}")
        if k == 0:
            return
        with nogil:
            pool.run_layer(layer, &xv[0], &iv[0], &wv[0], &sv[0], k, &ov[0, 0])

    def run_layer_sum(self, int layer, x, ids, weights, skip, out):
        """out = the sum of run_layer's rows j with skip[j] == 0, in order of j (zeros when every j is skipped)."""
        cdef CppExpertPool* pool = self.native()
        cdef const float[::1] xv = x
        cdef const int32_t[::1] iv = ids
        cdef const float[::1] wv = weights
        cdef const uint8_t[::1] sv = skip
        cdef float[::1] ov = out
        cdef int k = self.checked_request("run_layer_sum", xv, iv, wv, sv)
        if ov.shape[0] != self.n_embd:
            raise InvalidArgument(f"run_layer_sum: out has {ov.shape[0]} entries, n_embd is {self.n_embd}")
        cdef const int32_t* ip = &iv[0] if k > 0 else NULL
        cdef const float* wp = &wv[0] if k > 0 else NULL
        cdef const uint8_t* sp = &sv[0] if k > 0 else NULL
        with nogil:
            pool.run_layer_sum(layer, &xv[0], ip, wp, sp, k, &ov[0])

    cdef int checked_request(self, str what, const float[::1] x, const int32_t[::1] ids, const float[::1] weights,
                             const uint8_t[::1] skip) except -1:
        """k, once x, ids, weights and skip agree on n_embd and k."""
        cdef int k = ids.shape[0]
        if x.shape[0] != self.n_embd:
            raise InvalidArgument(f"{what}: x has {x.shape[0]} entries, n_embd is {self.n_embd}")
        if weights.shape[0] != k or skip.shape[0] != k:
            raise InvalidArgument(f"{what}: ids has {k} entries; weights {weights.shape[0]} and skip "
                                  f"{skip.shape[0]} must have {k}")
        return k

    def run_groups(self, int layer, x, experts, begin, out=None):
        """out[r] = expert experts[g] (x[r]), unweighted, for every row r in begin[g]..begin[g+1]-1: x is
        [begin[-1], n_embd] float32, experts [groups] int32, begin [groups + 1] int32 from 0. Returns out (made
        here unless given: [begin[-1], n_embd] float32)."""
        cdef CppExpertPool* pool = self.native()
        cdef const float[:, ::1] xv = x
        cdef const int32_t[::1] ev = experts
        cdef const int[::1] bv = begin
        cdef int groups = ev.shape[0]
        if bv.shape[0] != groups + 1:
            raise InvalidArgument(f"run_groups: experts has {groups} entries, so begin must have {groups + 1}, "
                                  f"found {bv.shape[0]}")
        cdef long rows = bv[groups]
        if xv.shape[0] != rows or xv.shape[1] != self.n_embd:
            raise InvalidArgument(f"run_groups: x is {xv.shape[0]}x{xv.shape[1]}, begin[-1] and n_embd ask for "
                                  f"{rows}x{self.n_embd}")
        if out is None:
            out = np.empty((rows, self.n_embd), np.float32)
        cdef float[:, ::1] ov = out
        if ov.shape[0] != rows or ov.shape[1] != self.n_embd:
            raise InvalidArgument(f"run_groups: out is {ov.shape[0]}x{ov.shape[1]}, must be {rows}x{self.n_embd}")
        # Empty x and out have no first element to point at; the native side reads neither when rows is 0.
        cdef const float* xp = &xv[0, 0] if rows > 0 else NULL
        cdef float* op = &ov[0, 0] if rows > 0 else NULL
        cdef const int32_t* ep = &ev[0] if groups > 0 else NULL
        with nogil:
            pool.run_groups(layer, xp, ep, &bv[0], groups, op)
        return out

    def run_rows_sum(self, int layer, x, ids, weights, skip, out):
        """out[r] = run_layer_sum's row of x[r], ids[r], weights[r], skip[r] for every row r, each expert computed
        once for all the rows that route to it: x, out [rows, n_embd] float32; ids int32, weights float32, skip
        uint8 [rows, k]."""
        cdef CppExpertPool* pool = self.native()
        cdef const float[:, ::1] xv = x
        cdef const int32_t[:, ::1] iv = ids
        cdef const float[:, ::1] wv = weights
        cdef const uint8_t[:, ::1] sv = skip
        cdef float[:, ::1] ov = out
        cdef int rows = iv.shape[0], k = iv.shape[1]
        if xv.shape[0] != rows or xv.shape[1] != self.n_embd or ov.shape[0] != rows or ov.shape[1] != self.n_embd:
            raise InvalidArgument(f"run_rows_sum: x is {xv.shape[0]}x{xv.shape[1]} and out {ov.shape[0]}x"
                                  f"{ov.shape[1]}; ids ask for {rows}x{self.n_embd}")
        if wv.shape[0] != rows or wv.shape[1] != k or sv.shape[0] != rows or sv.shape[1] != k:
            raise InvalidArgument(f"run_rows_sum: ids are {rows}x{k}; weights ({wv.shape[0]}x{wv.shape[1]}) and "
                                  f"skip ({sv.shape[0]}x{sv.shape[1]}) must be too")
        if rows == 0:
            return
        cdef const int32_t* ip = &iv[0, 0] if k > 0 else NULL
        cdef const float* wp = &wv[0, 0] if k > 0 else NULL
        cdef const uint8_t* sp = &sv[0, 0] if k > 0 else NULL
        with nogil:
            pool.run_rows_sum(layer, &xv[0, 0], ip, wp, sp, rows, k, &ov[0, 0])

    def open_expert_file(self, str path, bint direct=True, int io_threads=8, int staging_slots=0):
        """Opens the model file for the tiered layers: O_DIRECT reads where its file system takes them (else
        buffered ones whose pages are dropped), `io_threads` reading, `staging_slots` experts per half of the
        staging (0: max_k)."""
        cdef CppExpertPool* pool = self.native()
        cdef ExpertFileOptions options
        options.direct = direct
        options.io_threads = io_threads
        options.staging_slots = staging_slots
        cdef string cpath = os.fsencode(path)
        with nogil:
            pool.open_expert_file(cpath, options)

    def set_tiered_layer(self, int layer, dict gate, dict up, dict down, list files, int slots, hold,
                         dict policy=None):
        """Registers one layer as tiered: its matrices' specs without planes, files [(offset, expert_stride, ggml
        type)] for gate, up and down, `slots` experts in the pool's arena starting with `hold` (read here), then
        moved by the decode calls as `policy` says ({"replace", "admit_after", "window", "max_moves"})."""
        cdef CppExpertPool* pool = self.native()
        cdef ExpertMatrix g = expert_matrix(gate), u = expert_matrix(up), d = expert_matrix(down)
        cdef FileMatrix f[3]
        file_matrices(files, f)
        cdef vector[int] held = [int(e) for e in hold]
        cdef TierPolicy p = tier_policy(policy or {})
        with nogil:
            pool.set_tiered_layer(layer, g, u, d, f[0], f[1], f[2], slots, held, p)

    @staticmethod
    def tier_sizes(int layer, dict gate, dict up, dict down, list files) -> tuple:
        """(arena slot bytes, staging bounce bytes) of one expert of a tiered layer of these matrices."""
        cdef ExpertMatrix g = expert_matrix(gate), u = expert_matrix(up), d = expert_matrix(down)
        cdef FileMatrix f[3]
        file_matrices(files, f)
        cdef TierSizes sizes = CppExpertPool.tier_sizes(layer, g, u, d, f[0], f[1], f[2])
        return sizes.slot_bytes, sizes.bounce_bytes

    def is_tiered(self, int layer) -> bool:
        return self.native().is_tiered(layer)

    def tier_stats(self) -> list:
        """Per tiered layer: layer, slots, hits, misses, moves, bytes_read and the arena's experts."""
        cdef vector[TierLayerStats] stats = self.native().tier_stats()
        return [tier_layer_stats(s) for s in stats]

    def expert_file_info(self) -> dict:
        """The disk tier's file, read mode, staging and arenas, and the bytes read so far."""
        cdef ExpertFileInfo i = self.native().expert_file_info()
        return {"path": os.fsdecode(i.path), "direct": i.direct, "buffered_reason": i.buffered_reason.decode(),
                "io_threads": i.io_threads, "staging_slots": i.staging_slots, "staging_bytes": i.staging_bytes,
                "staging_locked": i.staging_locked, "arena_bytes": i.arena_bytes, "arenas_locked": i.arenas_locked,
                "bytes_read": i.bytes_read}

    def expert_bytes(self, int layer) -> int:
        """Bytes of one expert of `layer` in canonical form (gate, up and down, every plane)."""
        return self.native().expert_bytes(layer)

    def read_expert(self, int layer, int expert):
        """One expert's canonical planes wherever it lives: uint8, gate then up then down, each's planes in the
        order codes, d, sub_scales, mins, sub_mins."""
        cdef CppExpertPool* pool = self.native()
        out = np.empty(pool.expert_bytes(layer), np.uint8)
        cdef uint8_t[::1] view = out
        with nogil:
            pool.read_expert(layer, expert, &view[0])
        return out

    def read_bandwidth(self, long nbytes, int reps=5) -> float:
        """Best bytes/s of all workers reading an nbytes buffer (each worker its own first-touched slice)."""
        cdef CppExpertPool* pool = self.native()
        cdef double bw
        with nogil:
            bw = pool.read_bandwidth(nbytes, reps)
        return bw

    def close(self):
        """Stops the workers and restores the constructing thread's CPU affinity."""
        cdef CppExpertPool* pool = self.native()
        with nogil:
            pool.close()

    @property
    def threads(self) -> int:
        return self.native().threads()

    @property
    def participants(self) -> int:
        return self.native().participants()

    @property
    def isa(self) -> str:
        return "avx512" if self.native().isa() == Isa.kAvx512 else "avx2"

    @property
    def worker_cpus(self) -> list:
        return [tuple(c) for c in self.native().worker_cpus()]

    @property
    def caller_cpus(self) -> tuple:
        return tuple(self.native().caller_cpus())

    @property
    def parked_workers(self) -> int:
        return self.native().parked_workers()
