// f32 rows -> GGUF block formats (core/quants.h): the quantizers of llama.cpp's ggml for the legacy types
// (Q4_0, Q4_1, Q5_0, Q5_1), the k-quants (Q2_K .. Q6_K), IQ4_NL / IQ4_XS, and Q8_K (the k-quants' activation
// type), with optional importance weights ("imatrix": one non-negative weight per column of the row).
//
// Exactness: every value is computed with the same f32 operations in the same order as ggml-quants.c's
// quantize_row_*_ref (no importance weights) and quantize_row_*_impl (with them), as ggml_quantize_chunk
// calls them, so the blocks are byte for byte the ones llama-quantize writes (tests/test_quantize_blocks.cpp
// holds them against tests/fixtures/quants/ggml_ref.bin). This file is compiled without FMA contraction
// (CMakeLists.txt), as ggml-base is built for baseline x86-64.
//
// The searches, in brief (n: elements of a (sub-)block, L: the integer codes chosen):
//   legacy, no weights      scale from the absolute max (Q4_0 / Q5_0) or the min and max (Q4_1 / Q5_1)
//   signed codes, weighted  (make_qx_quants) the scale -nmax / max and 18 neighbours -(nmax +- 0.1 k) / max;
//                           keeps the one maximising (sum w x l)^2 / sum w l^2
//   codes with a min        (make_qkx_quants) nstep + 1 trial scales; per trial the weighted least-squares
//                           scale and min of the rounded codes; keeps the lowest weighted error
//   scales of scales        (make_qp_quants) 6-bit / 4-bit unsigned codes of the sub-block scales and mins
//   Q3_K without weights    (make_q3_quants) rounding then up to 5 passes moving single codes
//   IQ4_NL / IQ4_XS         nearest of the 16 non-linear levels, 15 trial scales per 32-element block
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/quants.h"

namespace ultra {

// Whether quantize_row() writes type t (the types named above; Q8_0 is cpu::quantize_row_q8_0's).
bool can_quantize_blocks(GgmlType t);

// One row x[n] -> its blocks of type t at dst (row_bytes(t, n) bytes). n must be a multiple of the type's
// block size. imatrix: nullptr, or the row's n importance weights (llama.cpp's imatrix values for the
// tensor's input columns). Q8_K ignores imatrix. Throws ultra::Error for a type can_quantize_blocks refuses
// or an n that is not a whole number of blocks.
void quantize_row(GgmlType t, const float* x, int64_t n, void* dst, const float* imatrix = nullptr);

// Q8_K (quantize_row_q8_K_ref): x[n], n a multiple of 256 -> n / 256 blocks. d = max / -127 of the
// signed absolute max, qs = round(x / d) clamped to 127, bsums the sums of qs per 16.
void quantize_row_q8_K(const float* x, int64_t n, BlockQ8_K* y);

}  // namespace ultra
