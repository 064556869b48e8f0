# The token sampler: host round trips (strata::kernel_check). Each uploads its inputs, runs one
# kernel into a poisoned, guarded output and copies it back: for tests and benchmarks, not the token path.
from libc.stdint cimport int32_t

from strata._native_check_kernels cimport cpp_sample_tokens

def sample_tokens(logits, params, draws, seen=(), bint graph=False, bint argmax_path=False, int device=0):
    """The token strata.sampling.sample(logits, params, u, seen) picks for each u in `draws`, on GPU `device`.

    `params` is a strata.sampling.SamplingParams; returns int32 [len(draws)]. With graph=True the sampler is
    captured once into a CUDA graph and replayed per draw, the values rewritten in device memory in between.
    With argmax_path=True the launch is the argmax's without a sort (sample_argmax), as the decode step runs it
    for greedy or top-k 1 values (anything else is refused).
    """
    cdef const float[::1] lv = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
    cdef const double[::1] dv = np.ascontiguousarray(draws, dtype=np.float64).reshape(-1)
    # Clipping to the int32 range keeps an out-of-range id out of range, so the native check still names it.
    seen64 = np.asarray(seen, dtype=np.int64).reshape(-1)
    cdef const int32_t[::1] sv = np.clip(seen64, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    cdef int vocab = lv.shape[0], n_seen = sv.shape[0], n_draws = dv.shape[0]
    cdef double temperature = params.temperature, top_p = params.top_p, min_p = params.min_p
    cdef double repeat_penalty = params.repeat_penalty
    cdef int top_k = params.top_k
    tokens = np.empty(n_draws, np.int32)
    cdef int32_t[::1] tv = tokens
    # Empty inputs pass NULL; the native checks refuse them before reading.
    cdef const float* lp = &lv[0] if vocab else NULL
    cdef const int32_t* sp = &sv[0] if n_seen else NULL
    cdef const double* dp = &dv[0] if n_draws else NULL
    cdef int32_t* tp = &tv[0] if n_draws else NULL
    with nogil:
        cpp_sample_tokens(device, lp, vocab, sp, n_seen, temperature, top_k, top_p, min_p, repeat_penalty, dp,
                          n_draws, graph, argmax_path, tp)
    return tokens
