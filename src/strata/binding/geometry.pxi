# The model geometry the core reads (strata/geometry.hpp), converted by Cython from a dict of its fields
# (strata.runtime.geometry.native_geometry builds it from GEOMETRY_FIELDS).
from strata.libstrata.geometry cimport ModelGeometry

cdef ModelGeometry _blank_geometry
_GEOMETRY_DEFAULTS = _blank_geometry  # the struct as a dict: every field, with the core's defaults
GEOMETRY_FIELDS = tuple(_GEOMETRY_DEFAULTS)  # ModelGeometry's field names, in the header's order


cdef ModelGeometry model_geometry(dict g) except *:
    """The core's ModelGeometry from a dict of every field; names a missing, unknown or unconvertible field."""
    missing = sorted(_GEOMETRY_DEFAULTS.keys() - g.keys())
    unknown = sorted(g.keys() - _GEOMETRY_DEFAULTS.keys())
    if missing or unknown:
        raise InvalidArgument(f"model geometry: {'missing ' + ', '.join(missing) if missing else ''}"
                              f"{'; ' if missing and unknown else ''}"
                              f"{'unknown ' + ', '.join(unknown) if unknown else ''} "
                              "(strata.runtime.geometry.native_geometry writes every field)")
    try:
        return g
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidArgument(f"model geometry: {_unconvertible_field(g)} ({error})") from None


cdef str _unconvertible_field(dict g):
    """Which field of `g` does not convert: each converted alone beside the defaults (conversion is per field)."""
    cdef ModelGeometry probe
    for name, default in _GEOMETRY_DEFAULTS.items():
        try:
            probe = {**_GEOMETRY_DEFAULTS, name: g[name]}
        except (TypeError, ValueError, OverflowError):
            return f"{name}: {type(default).__name__} expected, got {g[name]!r}"
    return "a field does not convert"
