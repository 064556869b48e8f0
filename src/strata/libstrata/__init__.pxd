# The core's headers as Cython declarations: one .pxd per bound header of cuda/include/strata, so a binding
# cimports strata.libstrata.<header>.
