// Quantisers and format conversions of the low-bit weight types: F8_E4M3 rows (core/fp8.h), TERNARY rows
// (core/ternary.h) and llama.cpp's TQ1_0 / TQ2_0 blocks (bit-exact with ggml-quants.c's
// quantize_row_tq{1,2}_0_ref and dequantize_row_tq{1,2}_0; tests/test_lowbit.cpp checks them against
// fixtures made by that C code). docs/QUANTIZATION.md describes the layouts.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ultra {

// F8_E4M3: the row scale absmax / 448, and codes of x / scale (round to nearest even, saturating).
float fp8_row_scale(const float* x, int64_t n);
void quantize_row_fp8(const float* x, int64_t n, float scale, uint8_t* out);

// TERNARY: the BitNet b1.58 scale max(mean |x|, 1e-5) of n values, and the trits clamp(round(x / s), -1, 1)
// packed 16 per word (n % 16 == 0).
float ternary_scale(double sum_abs, int64_t n);
void quantize_row_ternary(const float* x, int64_t n, float scale, uint32_t* out);

// TQ1_0 / TQ2_0 rows of n values (n % 256 == 0), exactly as ggml's reference code.
void quantize_row_tq1_0(const float* x, int64_t n, BlockTQ1_0* out);
void quantize_row_tq2_0(const float* x, int64_t n, BlockTQ2_0* out);
void dequantize_row_tq1_0(const BlockTQ1_0* b, int64_t n, float* out);
void dequantize_row_tq2_0(const BlockTQ2_0* b, int64_t n, float* out);

// The trits of one block in element order (-1, 0, +1). TQ2_0's code 3 (ggml decodes it as +2) is not a
// trit: tq2_0_trits returns false on it.
void tq1_0_trits(const BlockTQ1_0& b, int8_t out[kQK_K]);
bool tq2_0_trits(const BlockTQ2_0& b, int8_t out[kQK_K]);

}  // namespace ultra
