# Canonical weight forms (strata.quant) as the core's descriptors: form, planes, float kind. Shared with the
# test hooks through _native.pxd.
from libc.stdint cimport int8_t, uint8_t, uint16_t

from strata.libstrata.forms cimport Codebook, FloatKind, QuantForm, QuantPlanes

# numpy dtype of a float weight -> its FloatKind; bf16 travels as its raw uint16 bits (as strata.quant holds it).
_FLOAT_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2}
_PLANES = ("codes", "d", "sub_scales", "mins", "sub_mins")


cdef Codebook codebook_of(object form) except *:
    from strata.quant import forms

    if form.codebook is None:
        return <Codebook>0  # Codebook::None (a Python keyword, so not declared by name)
    book = tuple(form.codebook)
    if book == forms.IQ4_NL_CODEBOOK:
        return Codebook.Iq4Nl
    if book == forms.MXFP4_CODEBOOK:
        return Codebook.Mxfp4
    if book == forms.IQ2_CODEBOOK:
        return Codebook.Iq2
    if book == forms.IQ3_XXS_CODEBOOK:
        return Codebook.Iq3Xxs
    if book == forms.IQ3_S_CODEBOOK:
        return Codebook.Iq3S
    if book == forms.IQ1_CODEBOOK:
        return Codebook.Iq1
    raise InvalidArgument(f"form {form.name}: codebook {book} is none of strata.quant.forms' tables")


cdef QuantForm quant_form(object form) except *:
    cdef QuantForm f
    f.code_bits = form.code_bits
    f.code_bias = form.code_bias
    f.codebook = codebook_of(form)
    f.group_size = form.group_size
    f.super_size = form.super_size
    f.scale_f32 = form.scale_dtype == "float32"
    f.has_sub_scales = form.has_sub_scales
    f.has_mins = form.has_mins
    return f


cdef const void* plane_pointer(plane, list keep) except? NULL:
    """Address of a C-contiguous plane (NULL for None); the array is kept alive in `keep`."""
    if plane is None:
        return NULL
    arr = np.ascontiguousarray(plane)
    keep.append(arr)
    cdef const unsigned char[::1] bytes_view = arr.reshape(-1).view(np.uint8)
    return &bytes_view[0]


cdef QuantPlanes quant_planes(object weight, list keep) except *:
    cdef QuantPlanes p
    p.codes = <const uint8_t*>plane_pointer(weight.codes, keep)
    p.d = plane_pointer(weight.d, keep)
    p.sub_scales = <const int8_t*>plane_pointer(weight.sub_scales, keep)
    p.mins = <const uint16_t*>plane_pointer(weight.mins, keep)
    p.sub_mins = <const uint8_t*>plane_pointer(weight.sub_mins, keep)
    return p


cdef FloatKind float_kind(object weight) except *:
    kind = _FLOAT_KINDS.get(weight.dtype)
    if kind is None or weight.ndim != 2:
        raise InvalidArgument(f"a float weight must be a 2-D float32, float16 or uint16 (bf16 bits) array; "
                              f"found {weight.dtype}{list(weight.shape)}")
    return <FloatKind>kind
