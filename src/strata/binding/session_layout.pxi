# The session's arena layout (strata/session_layout.hpp): the memory plan reads it.
from strata.libstrata.session_layout cimport (
    Place, SessionLayout, cpp_plan_session, kKvPageTokens, kMaxSnapshots,
)

KV_PAGE_TOKENS = kKvPageTokens  # tokens per KV page: sessions hold whole pages
MAX_SNAPSHOTS = kMaxSnapshots   # state snapshot slots a session may have


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
