# The core's headers as Cython declarations: one .pxd per bound header of cuda/include/strata (check/: the test
# hooks' headers), so a binding cimports strata.libstrata.<header>.
