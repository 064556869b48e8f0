# Declarations of the logprobs limit (cuda/include/strata/logprobs.hpp).

cdef extern from "strata/logprobs.hpp" nogil:
    const int kMaxLogprobs "strata::kMaxLogprobs"
