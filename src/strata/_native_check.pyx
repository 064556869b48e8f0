# cython: language_level=3, boundscheck=False, wraparound=False
"""strata._native_check: the test hooks' binding (development and test builds only; wheels leave it out).

Round trips of single kernels and of the CPU pool's kernels, the expert exchange through the session's token
schedule, and checks over the production objects of strata._native; every one allocates and synchronises, and
none is on the token path. Errors cross as in strata._native.
"""
import numpy as np

from strata.errors import InvalidArgument

# Each header of the test hooks (cuda/include/strata/check/<header>.hpp) has its declarations in
# libstrata/check/<header>.pxd and its binding in binding/check/<header>.pxi.
include "binding/check/q8_host.pxi"
include "binding/check/kernel_check.pxi"
include "binding/check/kernel_check_matmul.pxi"
include "binding/check/kernel_check_mixers.pxi"
include "binding/check/kernel_check_attention_chunk.pxi"
include "binding/check/kernel_check_kv_window.pxi"
include "binding/check/kernel_check_launch.pxi"
include "binding/check/exchange_check.pxi"
include "binding/check/weights_check.pxi"
include "binding/check/arena_check.pxi"
include "binding/check/routes_check.pxi"
include "binding/check/pool_check.pxi"
