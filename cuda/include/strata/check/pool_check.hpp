// The CPU pool's kernels on one expert, outside a layer job, so tests can check each half of an expert's
// product against the numpy reference, and a benchmark can time the row kernels alone. Host-only header, no CUDA.
#pragma once

#include <cstdint>

#include "strata/expert_pool.hpp"

namespace strata::pool_check {

// y [m.rows] = W x for expert `expert` of `m`, with the row kernels of `isa` and x as a layer job gives it:
// float32 to a float matrix, quantized to q8_32 for a quantized one. The kernel runs on consecutive ranges of
// `rows_per_call` rows (the last may be shorter; 0: all rows in one call), so tests can show that a row's
// result does not depend on the range it runs in.
void expert_matvec(cpu::Isa isa, const cpu::ExpertMatrix& m, int64_t expert, const float* x, float* y,
                   int64_t rows_per_call = 0);

// expert_matvec with the AVX-512 kernels' source, vpdpbusd emulated (cuda/src/check/vnni_emulated.cpp), on any
// AVX2 CPU: quantized forms only; InvalidArgument without AVX2.
void emulated_vnni_matvec(const cpu::ExpertMatrix& m, int64_t expert, const float* x, float* y,
                          int64_t rows_per_call = 0);

// h [gate.rows] = silu(gate x) * up x of expert `expert`, computed by the code a layer job runs (bit for bit).
void expert_hidden(cpu::Isa isa, const cpu::ExpertMatrix& gate, const cpu::ExpertMatrix& up, int64_t expert,
                   const float* x, float* h);

// Seconds that `calls` runs of the row kernels of `isa` take over rows [0, rows) of m's experts, call c on expert
// c % m.n_expert, x quantized once as a layer job gives it, on the caller's thread alone: with one expert the
// rows stay in the core's caches (the kernels' own speed), with many the calls stream through memory.
double time_rows(cpu::Isa isa, const cpu::ExpertMatrix& m, const float* x, int64_t rows, int64_t calls);

// A layer job's claims of its work items (cpu/item_claims.hpp): `items` items in `parts` segments.
// claim_order: participant p claiming alone, the items in the order it gets them, into order [items].
// claim_items: `participants` threads claiming at once, thread i starting delays_us[i] microseconds late;
// claimed_by [items] the participant that got each item, claims [items] how often it was handed out.
void claim_order(int64_t items, int parts, int p, int64_t* order);
void claim_items(int64_t items, int parts, int participants, const int* delays_us, int* claimed_by, int* claims);

}  // namespace strata::pool_check
