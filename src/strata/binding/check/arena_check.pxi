# A session arena (strata/session_arena.hpp) whose bytes tests can poison and read back (strata::arena_check).
from libcpp.memory cimport unique_ptr

from strata._native cimport kv_storage, layout_dict, model_geometry
from strata.libstrata.check.arena_check cimport cpp_arena_download, cpp_arena_fill
from strata.libstrata.geometry cimport ModelGeometry
from strata.libstrata.kv_format cimport KvStorage
from strata.libstrata.session_arena cimport CppSessionArena
from strata.libstrata.session_layout cimport SessionLayout, cpp_plan_session


cdef class SessionArena:
    """One session's sequence state in VRAM (strata/session_arena.hpp), laid out for `geometry` (as
    strata.runtime.geometry.native_geometry writes it), `context` tokens and `kv`, with or without KV streaming."""
    cdef unique_ptr[CppSessionArena] arena

    def __cinit__(self, dict geometry, int context, kv, int device=0, int snapshots=0, bint kv_streaming=False):
        cdef ModelGeometry g = model_geometry(geometry)
        cdef KvStorage storage = kv_storage(kv)
        cdef SessionLayout layout
        with nogil:
            layout = cpp_plan_session(g, context, storage, snapshots, kv_streaming)
            self.arena.reset(new CppSessionArena(device, layout))

    @property
    def layout(self) -> dict:
        return layout_dict(self.arena.get().layout())

    def reset(self) -> None:
        with nogil:
            self.arena.get().reset()

    def snapshot(self, int slot) -> None:
        with nogil:
            self.arena.get().snapshot(slot)

    def restore(self, int slot) -> None:
        with nogil:
            self.arena.get().restore(slot)

    def fill(self, int byte) -> None:
        """Set every byte of the arena (poison before proving reset)."""
        cdef unsigned char b = byte
        with nogil:
            cpp_arena_fill(self.arena.get()[0], b)

    def download(self):
        """The arena's bytes."""
        out = np.empty(self.arena.get().layout().total, np.uint8)
        cdef unsigned char[::1] view = out
        with nogil:
            cpp_arena_download(self.arena.get()[0], &view[0])
        return out

    def __dealloc__(self):
        with nogil:
            self.arena.reset()
