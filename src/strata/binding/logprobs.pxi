# The logprobs limit (strata/logprobs.hpp): what DecodeSession.logprobs takes, exported for Python's checks.
from strata.libstrata.logprobs cimport kMaxLogprobs

MAX_LOGPROBS = kMaxLogprobs  # the most alternatives a position reports
