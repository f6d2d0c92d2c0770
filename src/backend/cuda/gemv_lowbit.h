// Low-bit weights on the device (Q8_0, F8_E4M3, TERNARY): their device layout, the host repacking into
// it, the decode GEMV (gemv_lowbit.cu) that cuda::gemv dispatches to, and the dequantisation to BF16 that
// the prefill GEMM (CudaMatmul::matmul) runs before cuBLASLt. Included by kernels.h.
//
// Device layout. Weights are uploaded in a layout of their own, made once on the host by
// lowbit_pack_rows(): every row starts 16-byte aligned (row_bytes = lowbit_row_bytes(type, cols), a multiple
// of 16, zero-padded), so that the kernels read rows with 16-byte loads.
//  * Q8_0: row r = cols int8 codes, then the cols / 32 f16 block scales d (block b's at byte cols + 2 b),
//    then zeros: W[r, c] = d[c / 32] * q[c]. (GGUF interleaves them as 34-byte blocks, which are not 16-byte
//    aligned.) WeightView::scale is null: the scales are in the row (8.5 bits per weight, as the file).
//  * F8_E4M3: row r = cols E4M3 codes, then zeros (code 0 = +0); the f32 scales as WeightView describes
//    them (scale, scale_group, scale_row_stride: per tensor, per row or per row and group), scale in device
//    memory: W[r, c] = decode(code[r, c]) * scale[r * scale_row_stride + c / scale_group].
//  * TERNARY: row r = cols / 16 words of 16 trits (core/ternary.h), then zero words (trit 0); scales as for
//    F8_E4M3 (scale_group a multiple of 16 dividing cols).
// Every other field of the WeightView (type, rows, cols) is as on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/gemv_kquant.h"
#include "core/views.h"

namespace ultra::cuda {

// Q8_0, F8_E4M3 or TERNARY, or one of the GGUF block types of gemv_kquant.h (Q4_0, Q4_K, Q5_K, Q6_K), whose
// device layout, GEMV and BF16 dequantisation the functions below dispatch to.
inline bool is_lowbit(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::F8_E4M3 || t == GgmlType::TERNARY || is_kquant(t);
}

// Bytes of one row in the device layout (a multiple of 16); 0 for a type that is not low-bit or a cols the
// type cannot hold (Q8_0: cols % 32 != 0; TERNARY: cols % 16 != 0).
size_t lowbit_row_bytes(GgmlType t, int64_t cols);

// Host: rows [r0, r1) of the host view w (GGUF layout, as the loader gives it) in the device layout, into
// out [(r1 - r0) * lowbit_row_bytes(w.type, w.cols)] (padding zeroed). The scales of F8_E4M3 / TERNARY are
// not touched (upload w.scale as it is). False if w is not a low-bit view the device layout takes.
bool lowbit_pack_rows(const WeightView& w, int64_t r0, int64_t r1, void* out);

// Number of scale values a F8_E4M3 / TERNARY view refers to (rows * scale_row_stride, or 1), 0 for Q8_0.
int64_t lowbit_scale_count(const WeightView& w);

// Most rows CudaMatmul::matmul runs through gemv_lowbit: its SIMT products cost about 7 us per extra row on
// a 4096 x 4096 matrix (docs/CUDA.md, "Tuning switches"), so steps of more rows dequantise the
// matrix to BF16 (lowbit_dequant_bf16) and take the BF16 path (the tensor-core gemv up to kGemvMaxRows rows,
// cuBLASLt above).
constexpr int kLowbitGemvMaxRows = 4;

// Decode / small batch (1 <= n <= kGemvMaxRows) on device-layout low-bit weights: y[t, r] = sum_c W[r, c]
// x[t, c] (+ bias[r]) (+= y). cuda::gemv() calls it for these types. Weights dequantised in registers, f32
// products and sums (each 16-column group's partial sum times its scale), every weight read once for all n
// rows; the sum order is fixed (deterministic). cudaErrorInvalidValue for views it does not take.
cudaError_t gemv_lowbit(const WeightView& w,  // [rows, cols], device layout
                        const float* x,       // [n, cols]
                        int n,
                        float* y,           // [n, rows]
                        const float* bias,  // [rows] or null
                        bool accumulate, cudaStream_t stream);

// One scale per row or per tensor (none per column group): an F8_E4M3 / TERNARY view whose scale for row r
// is scale[r * scale_row_stride].
inline bool lowbit_scale_per_row_or_tensor(const WeightView& w) {
  return (w.type == GgmlType::F8_E4M3 || w.type == GgmlType::TERNARY) && w.scale &&
         (w.scale_group <= 0 || w.scale_group >= w.cols);
}

// F8_E4M3 and TERNARY with a scale per row or tensor, 1 <= n <= 8, cols % 64 == 0, n * cols <= 16384: the
// tensor-core variant (gemv_lowbit_tc.cu; weights converted to exact f16 in registers, x as two f16 parts,
// f32 accumulation, ~1e-7 relative). gemv_lowbit_tc returns cudaErrorNotSupported, launching nothing, where
// gemv_lowbit_tc_ok is false. lowbit_tc_on: false when the environment sets ULTRA_CUDA_LOWBIT_TC=0 (A/B
// timing against the SIMT and streaming kernels); gemv_lowbit_tc_ok is then false.
// bulk_slots: > 0, the variant whose weights reach shared memory through bulk copies (cp.async.bulk, a ring
// of that many 4-step slots per warp, capped by the work and shared memory); 0, the lanes' 16-byte loads
// into registers; < 0, lowbit_tc_bulk_slots(): ULTRA_CUDA_LOWBIT_BULK=N (0-8) where the environment sets
// it, else -1, an automatic choice by type and shape (gemv_lowbit_tc.cu).
bool lowbit_tc_on();
int lowbit_tc_bulk_slots();
bool gemv_lowbit_tc_ok(const WeightView& w, int n);
cudaError_t gemv_lowbit_tc(const WeightView& w, const float* x, int n, float* y, const float* bias,
                           bool accumulate, cudaStream_t stream, int bulk_slots = -1);

// Prefill (CudaMatmul::matmul, steps the gemv kernels do not take) of F8_E4M3 weights with a scale per row or
// tensor through cuBLASLt's FP8 GEMM, x quantised per row to E4M3 (W8A8: ~3-4% relative error per product
// against ~0.4% for the BF16 copy), where this is true: ULTRA_CUDA_FP8_GEMM=1 (or tuning::set_fp8_gemm).
// Default: the BF16 copy of the weights and the BF16 GEMM.
bool fp8_gemm_on();

// Leading dimension (elements) of the BF16 copy that lowbit_dequant_bf16 writes: cols rounded up to 8
// (16-byte aligned rows for cuBLASLt).
inline int64_t lowbit_bf16_ld(int64_t cols) {
  return (cols + 7) / 8 * 8;
}

// out[r, c] = bf16(W[r, c]) (round to nearest even of the f32 product decode * scale), c < cols; zeros in
// [cols, ld). out: [rows, lowbit_bf16_ld(cols)] BF16, 16-byte aligned.
cudaError_t lowbit_dequant_bf16(const WeightView& w,  // [rows, cols], device layout
                                void* out, cudaStream_t stream);

}  // namespace ultra::cuda
