// Binding-side half of the error path: called from inside the catch block that Cython's `except +`
// opens, it rethrows the in-flight C++ exception and reports which strata kind it was.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "strata/error.hpp"

namespace strata_binding {

enum ErrorKind { kError = 0, kInvalidArgument, kOutOfMemory, kFormatError, kCudaError };

struct CaughtError {
  int kind = kError;
  std::string message;
  std::string cuda_name;
};

inline CaughtError current_error() {
  CaughtError caught;
  try {
    throw;
  } catch (const strata::CudaError& e) {
    caught = {kCudaError, e.what(), e.cuda_name()};
  } catch (const strata::FormatError& e) {
    caught = {kFormatError, e.what(), ""};
  } catch (const strata::OutOfMemory& e) {
    caught = {kOutOfMemory, e.what(), ""};
  } catch (const strata::InvalidArgument& e) {
    caught = {kInvalidArgument, e.what(), ""};
  } catch (const std::bad_alloc&) {
    caught = {kOutOfMemory, "host memory allocation failed", ""};
  } catch (const std::exception& e) {
    caught = {kError, e.what(), ""};
  } catch (...) {
    caught = {kError, "unknown native exception", ""};
  }
  return caught;
}

}  // namespace strata_binding
