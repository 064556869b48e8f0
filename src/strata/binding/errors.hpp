// Binding-side half of the error path: raise_strata_error() is the `except +` handler of every native
// call. Cython calls it inside the catch block; it rethrows the in-flight C++ exception, finds its strata
// kind and raises the matching strata.errors class. It is plain C++ (not a cdef function) so that every
// header's .pxd can name it in pure extern declarations, which add no import to the module.
#pragma once

#include <Python.h>

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

// Sets the Python exception for the C++ exception in flight; returns -1 (Cython's "error raised").
inline int raise_strata_error() {
  static const char* const kClassNames[] = {"StrataError", "InvalidArgument", "OutOfMemory", "FormatError",
                                            "CudaError"};
  const CaughtError caught = current_error();
  PyObject* errors = PyImport_ImportModule("strata.errors");
  if (errors == nullptr) return -1;
  PyObject* cls = PyObject_GetAttrString(errors, kClassNames[caught.kind]);
  Py_DECREF(errors);
  if (cls == nullptr) return -1;
  PyObject* error = caught.kind == kCudaError
                        ? PyObject_CallFunction(cls, "ss", caught.message.c_str(), caught.cuda_name.c_str())
                        : PyObject_CallFunction(cls, "s", caught.message.c_str());
  if (error != nullptr) {
    PyErr_SetObject(cls, error);
    Py_DECREF(error);
  }
  Py_DECREF(cls);
  return -1;
}

}  // namespace strata_binding
