"""Random routed experts in any weight form, for the CPU expert pool's benchmarks."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from strata.quant import QuantTensor, form_for
from strata.quant.forms import FLOAT_DTYPES, fitting_type, float_form_of
from strata.runtime.pool import ExpertWeight
from strata.synth.blocks import fill_float

# The benchmark model's routed experts: n_embd x expert_ff, gate/up and down types.
N_EMBD, FF = 2560, 640
GATE_UP, DOWN = T.Q4_K, T.Q4_0


def synthetic_experts(ggml_type: T, rows: int, cols: int, n_expert: int, rng: np.random.Generator) -> ExpertWeight:
    """Random planes of ``n_expert`` experts in ``ggml_type``'s form; finite, moderate scales (no denormals)."""
    ggml_type = fitting_type(ggml_type, cols)
    form = form_for(ggml_type)
    if form.is_float:  # random sign and mantissa under one exponent: weights in ±[2^-6, 2^-5)
        raw = np.frombuffer(rng.bytes(rows * n_expert * cols * FLOAT_DTYPES[form.float_kind].itemsize), np.uint8).copy()
        fill_float(raw, ggml_type, 2.0**-6)
        return raw.view(FLOAT_DTYPES[form.float_kind]).reshape(rows * n_expert, cols)
    q = QuantTensor.empty(form, rows * n_expert, cols)
    q.codes[...] = np.frombuffer(rng.bytes(q.codes.size), np.uint8).reshape(q.codes.shape)
    q.d[...] = rng.uniform(1e-3, 1e-2, q.d.shape).astype(q.d.dtype)
    if q.sub_scales is not None:
        q.sub_scales[...] = rng.integers(-32, 32, q.sub_scales.shape, dtype=np.int8)
    if q.mins is not None:
        q.mins[...] = rng.uniform(-1e-2, 1e-2, q.mins.shape).astype(np.float16)
    if q.sub_mins is not None:
        q.sub_mins[...] = rng.integers(0, 64, q.sub_mins.shape, dtype=np.uint8)
    return q


def form_name(w: ExpertWeight) -> str:
    """The weight form of `w`'s planes (a float array's float form, else its quantized form)."""
    return float_form_of(w).name if isinstance(w, np.ndarray) else w.form.name
