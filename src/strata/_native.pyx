# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native: the thin binding over the native core (strata_core).

Every native call that can take time runs with the GIL released, construction and destruction included;
every native object is owned through a unique_ptr; every C++ exception crosses here, once, into a
strata.errors class. The test hooks are another extension, strata._native_check, which wheels leave out.
"""
import numpy as np

from strata.errors import InvalidArgument
from strata.options import KV, Mode

# Each bound header of the core (cuda/include/strata/<header>.hpp) has its declarations in
# libstrata/<header>.pxd and its binding in binding/<header>.pxi.
include "binding/device.pxi"
include "binding/self_test.pxi"
include "binding/forms.pxi"
include "binding/cpu_topology.pxi"
include "binding/expert_tiers.pxi"
include "binding/expert_pool.pxi"
include "binding/device_weights.pxi"
include "binding/file_rows.pxi"
include "binding/ple_gather.pxi"
include "binding/geometry.pxi"
include "binding/kv_format.pxi"
include "binding/session_layout.pxi"
include "binding/expert_policy.pxi"
include "binding/expert_cache.pxi"
include "binding/expert_staging.pxi"
include "binding/logprobs.pxi"
include "binding/pinned_host.pxi"
include "binding/decode_session.pxi"
include "binding/machine_rates.pxi"
