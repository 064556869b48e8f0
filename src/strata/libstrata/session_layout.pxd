# Declarations of the session's arena layout (cuda/include/strata/session_layout.hpp).
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.geometry cimport ModelGeometry
from strata.libstrata.kv_format cimport KvStorage


cdef extern from "strata/session_layout.hpp" nogil:

    cdef enum class Place "strata::Place":
        Device
        Host

    cdef cppclass LayoutRegion "strata::Region":
        string name
        int layer
        size_t offset
        size_t bytes
        Place place

    cdef cppclass SessionLayout "strata::SessionLayout":
        int kv_pages
        int snapshots
        cbool kv_streaming
        int window_slots
        size_t state_bytes
        vector[LayoutRegion] regions
        size_t total
        size_t host_total

    const int kKvPageTokens "strata::kKvPageTokens"
    const int kMaxSnapshots "strata::kMaxSnapshots"
    SessionLayout cpp_plan_session "strata::plan_session"(
        const ModelGeometry& geometry, int context, KvStorage kv, int snapshots,
        cbool kv_streaming) except +raise_strata_error
