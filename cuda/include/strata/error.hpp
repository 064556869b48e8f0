// The one exception family of strata's native core. Launchers return cudaError_t and never throw; the
// host-side code that owns resources throws these, and the Cython boundary maps each kind to its Python
// class (strata.errors). Nothing here exits, aborts or prints.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class OutOfMemory : public Error {
 public:
  using Error::Error;
};

class FormatError : public Error {
 public:
  using Error::Error;
};

class CudaError : public Error {
 public:
  CudaError(const std::string& message, std::string cuda_name)
      : Error(message), cuda_name_(std::move(cuda_name)) {}
  const std::string& cuda_name() const noexcept { return cuda_name_; }

 private:
  std::string cuda_name_;
};

namespace detail {
[[noreturn]] void throw_cuda_error(int code, const char* call, const char* file, int line);
std::string where(const char* file, int line);
}  // namespace detail

}  // namespace strata

// STRATA_EXPECTS(cond, Kind, message): throw strata::Kind("message (file:line)") unless cond holds.
#define STRATA_EXPECTS(cond, Kind, message)                                          \
  do {                                                                               \
    if (!(cond)) throw ::strata::Kind(std::string(message) + ::strata::detail::where(__FILE__, __LINE__)); \
  } while (0)

// STRATA_CUDA_TRY(call): run a CUDA runtime call; on failure throw strata::CudaError carrying the CUDA
// error name (or strata::OutOfMemory for cudaErrorMemoryAllocation). The error code is passed as int so
// that this header stays free of CUDA headers (Cython compiles it with the host compiler).
#define STRATA_CUDA_TRY(call)                                                           \
  do {                                                                                  \
    const int strata_cuda_status_ = static_cast<int>(call);                             \
    if (strata_cuda_status_ != 0)                                                       \
      ::strata::detail::throw_cuda_error(strata_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
