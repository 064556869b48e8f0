# Declarations of the matrix products' round trips (cuda/include/strata/check/kernel_check_matmul.hpp).
from libc.stdint cimport int32_t

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.forms cimport FloatKind, QuantForm, QuantPlanes


cdef extern from "strata/check/kernel_check_matmul.hpp" namespace "strata::kernel_check" nogil:
    cdef cppclass MatmulCheckRows "strata::kernel_check::MatmulCheckRows":
        int count, x_stride, y_stride
        const int32_t* slots
        const int32_t* begin
        int groups
    void cpp_matmul_quant "strata::kernel_check::matmul_quant"(
        int device, const QuantForm& form, const QuantPlanes& stack, int n_matrix, int rows, int cols,
        const MatmulCheckRows& x_rows, const float* x, float* y) except +raise_strata_error
    void cpp_matmul_float "strata::kernel_check::matmul_float"(
        int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols,
        const MatmulCheckRows& x_rows, const float* x, float* y) except +raise_strata_error
    double cpp_time_matmul_quant "strata::kernel_check::time_matmul_quant"(
        int device, const QuantForm& form, const QuantPlanes& stack, int n_matrix, int rows, int cols, int count,
        int groups, int reps) except +raise_strata_error
    double cpp_time_matmul_float "strata::kernel_check::time_matmul_float"(
        int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols, int count, int groups,
        int reps) except +raise_strata_error
