# The test hooks' headers (cuda/include/strata/check) as Cython declarations, one .pxd per header.
