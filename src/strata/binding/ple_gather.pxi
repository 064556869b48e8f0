# The PLE layer's n-gram rows gathered natively (strata::PleGather): strata.runtime.ple_rows.PleRows.native()
# builds one for the table types it reads, and the DecodeSession's host loop runs it. PleNgrams is the hash alone
# (strata::PleNgrams), which PleRows picks every other table type's rows by.
from libc.stdint cimport int64_t, uint64_t
from libcpp.memory cimport unique_ptr
from libcpp.vector cimport vector

from strata.libstrata.ple_gather cimport CppPleGather, CppPleNgrams, PleHash, PleRowType, PleTable

_PLE_ROW_TYPES = {"f32": PleRowType.F32, "f16": PleRowType.F16, "bf16": PleRowType.BF16, "q8_0": PleRowType.Q8_0}


cdef PleHash ple_hash(shape) except *:
    """The strata::PleHash of a strata.models.PleShape."""
    cdef PleHash h
    h.ngram, h.heads_per_ngram, h.eos = shape.ngram, shape.heads_per_ngram, shape.eos
    h.multipliers, h.head_sizes, h.head_offsets = shape.multipliers, shape.head_sizes, shape.head_offsets
    return h


cdef vector[int64_t] previous_ids(ids) except *:
    """ngram-1 ids (any int sequence) for set_previous."""
    return [int(v) for v in np.asarray(ids, dtype=np.int64).reshape(-1)]


cdef class PleNgrams:
    """A sequence's n-gram state under `shape`'s hash (a strata.models.PleShape) and the table rows of each token
    appended to it: the hash PleGather reads its rows by, run alone."""

    cdef unique_ptr[CppPleNgrams] ngrams
    cdef readonly int n_heads

    def __cinit__(self, shape):
        cdef PleHash h = ple_hash(shape)
        self.ngrams.reset(new CppPleNgrams(h))
        self.n_heads = self.ngrams.get().n_heads()

    def indices(self, int64_t token):
        """int64 [n_heads]: the table rows of `token` appended after the ids seen so far."""
        out = np.empty(self.n_heads, np.int64)
        cdef int64_t[::1] view = out
        self.ngrams.get().next(token, <uint64_t*>&view[0])
        return out

    def indices_for(self, tokens):
        """int64 [len(tokens), n_heads]: the table rows of each token appended in turn."""
        cdef const int64_t[::1] ids = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.n_heads), np.int64)
        cdef int64_t[:, ::1] view = out
        cdef Py_ssize_t i
        for i in range(ids.shape[0]):
            self.ngrams.get().next(ids[i], <uint64_t*>&view[i, 0])
        return out

    def reset(self) -> None:
        """An empty sequence: the ids before it read as EOS."""
        self.ngrams.get().reset()

    @property
    def previous(self):
        """int64 [ngram - 1]: the last ids seen, oldest first (EOS before the sequence)."""
        return np.array(self.ngrams.get().previous(), dtype=np.int64)

    @previous.setter
    def previous(self, ids) -> None:
        self.ngrams.get().set_previous(previous_ids(ids))


cdef class PleGather:
    """The rows PleRows.rows / rows_for give, and the same n-gram state, in the native core. `table`: the n-gram
    table's rows in the file (a FileRows of its own: the host loop reads through it), kept alive here; `row_type`:
    one of "f32", "f16", "bf16", "q8_0"; `shape`: the strata.models.PleShape whose hash it runs."""

    def __cinit__(self, FileRows table not None, str row_type, shape):
        if row_type not in _PLE_ROW_TYPES:
            raise InvalidArgument(f"PLE row type {row_type!r}: the native gather reads {sorted(_PLE_ROW_TYPES)}")
        cdef PleTable t
        t.rows = table.rows.get()
        t.head_dim = shape.head_dim
        t.row_type = _PLE_ROW_TYPES[row_type]
        cdef PleHash h = ple_hash(shape)
        self.table = table
        with nogil:
            self.gather.reset(new CppPleGather(t, h))
        self.n_heads, self.head_dim = self.gather.get().n_heads(), self.gather.get().head_dim()

    def rows(self, int64_t token):
        """float32 [n_heads, head_dim]: the rows of `token` appended after the ids seen so far."""
        out = np.empty((self.n_heads, self.head_dim), np.float32)
        cdef float[:, ::1] view = out
        with nogil:
            self.gather.get().rows(token, &view[0, 0])
        return out

    def rows_for(self, tokens):
        """float32 [len(tokens), n_heads, head_dim]: the rows of each token appended in turn."""
        cdef const int64_t[::1] ids = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.n_heads, self.head_dim), np.float32)
        cdef float[:, :, ::1] view = out
        cdef Py_ssize_t i
        with nogil:
            for i in range(ids.shape[0]):
                self.gather.get().rows(ids[i], &view[i, 0, 0])
        return out

    def reset(self) -> None:
        """An empty sequence: the ids before it read as EOS."""
        self.gather.get().reset()

    @property
    def previous(self):
        """int64 [ngram - 1]: the last ids seen, oldest first (EOS before the sequence)."""
        return np.array(self.gather.get().previous(), dtype=np.int64)

    @previous.setter
    def previous(self, ids) -> None:
        self.gather.get().set_previous(previous_ids(ids))
