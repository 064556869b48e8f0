// The spans of a step of several rows (docs/rows.md): a step's rows are runs of consecutive positions, each run
// (a span) one sequence's: one decode token of each of several sessions, the k + 1 rows of a verification, a
// prompt chunk. Kernels that read or write a sequence's state (GDN and conv state, KV and the QSA caches, the PLE
// history, a verification's row states) take their state pointers once, as offsets into a sequence's arena, and
// find each row's own through its span's arena, read from device memory: so a graph captured for R rows of S
// spans replays for any sequences (as FlashInfer's plan/run reads fixed indptr buffers). Without spans the
// pointers are the one sequence's own and every row is one span's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

// One span, in device memory.
struct StateSpan {
  char* state = nullptr;  // the sequence's arena, which the kernels' state offsets are relative to
  char* rows = nullptr;   // its first row-state slot, where each row's recurrent state is kept (null: none)
  int first = 0;          // its rows: first .. first + count - 1 of the step's buffers
  int count = 0;
};

// A step's spans as kernels take them: spans [n] and each row's span span_of [rows], both in device memory; n
// sizes the launches' grids. n == 0: no spans (the pointers are the sequence's own, every row one span's).
struct StepSpans {
  const StateSpan* spans = nullptr;
  const int* span_of = nullptr;
  int n = 0;
};

// `offset`, a state pointer taken as an offset into an arena, in the arena at `base`; a null base leaves the
// pointer as it is (the sequence's own).
template <class T>
__device__ __forceinline__ T* in_arena(T* offset, char* base) {
  return base ? reinterpret_cast<T*>(base + reinterpret_cast<std::uintptr_t>(offset)) : offset;
}

// Span `s` of the step, or, without spans, the one span of all `rows` rows.
__device__ __forceinline__ StateSpan step_span(const StepSpans& spans, int s, int rows) {
  return spans.n > 0 ? spans.spans[s] : StateSpan{nullptr, nullptr, 0, rows};
}

// The span of row `row`.
__device__ __forceinline__ StateSpan row_span(const StepSpans& spans, int row, int rows) {
  return spans.n > 0 ? spans.spans[spans.span_of[row]] : StateSpan{nullptr, nullptr, 0, rows};
}

// Where the row states of `span` go, from the kernel's row-state pointer `rows` (an offset into a row-state slot
// with spans, the sequence's own without): null where the span keeps none.
template <class T>
__device__ __forceinline__ T* kept_rows(T* rows, const StepSpans& spans, const StateSpan& span) {
  if (spans.n == 0) return rows;
  return span.rows ? reinterpret_cast<T*>(span.rows + reinterpret_cast<std::uintptr_t>(rows)) : nullptr;
}

// The grid's span extent: the spans, or one.
inline int span_extent(const StepSpans& spans) { return spans.n > 0 ? spans.n : 1; }

inline bool valid_spans(const StepSpans& spans) {
  return spans.n == 0 || (spans.n > 0 && spans.spans != nullptr && spans.span_of != nullptr);
}

}  // namespace strata::kernels
