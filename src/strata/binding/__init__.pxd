# The code that binds each core header, one .pxi per header, included by strata/_native.pyx.
