// GGUF block-quantized weights on the device (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): their device layout,
// the host repacking into it, the decode GEMV and the dequantisation to BF16 for the prefill GEMM.
// gemv_lowbit.h treats them as low-bit types (is_lowbit, lowbit_row_bytes, lowbit_pack_rows, gemv_lowbit,
// lowbit_dequant_bf16 dispatch here), so that the backend's upload, matmul and embedding paths take them.
//
// Device layout (one row, cols a multiple of the block: 32 for Q4_0, 256 for the k-quants; every row
// starts 16-byte aligned, row_bytes = kquant_row_bytes(type, cols), zero-padded to a multiple of 16):
//  * Q4_K, Q5_K: the GGUF blocks as they are (144 / 176 bytes, multiples of 16: the 16-byte header
//    d, dmin, scales[12], then Q5_K's qh[32], then qs[128]).
//  * Q6_K: per block its ql[128], qh[64], scales[16] (208 bytes), all blocks back to back, then the
//    cols / 256 f16 d of the blocks (GGUF's 210-byte blocks are only 2-byte aligned).
//  * Q4_0, Q4_1, Q5_0, Q5_1 (18- to 24-byte blocks): the qs[16] of every block, then (Q5_0 / Q5_1) the
//    4-byte qh of every block, then the f16 d of every block, then (Q4_1 / Q5_1) the f16 m of every block.
// The same bytes as the file up to the row padding. WeightView::scale is null (the scales are in the rows).
// Every decoded weight is the f32 value the CPU's dequant_block gives (core/quants.h), bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/views.h"

namespace ultra::cuda {

inline bool is_kquant(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

// Elements per block (32 or 256) of a kquant type, 0 otherwise.
inline int64_t kquant_block_elems(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ? 32
         : is_kquant(t)                                                                           ? 256
                                                                                                  : 0;
}

// Bytes of one row in the device layout (a multiple of 16), 0 for another type or cols not a multiple of
// the block.
size_t kquant_row_bytes(GgmlType t, int64_t cols);

// Host: rows [r0, r1) of the host view w (GGUF layout) into out [(r1 - r0) * kquant_row_bytes] in the
// device layout. False if w is not such a view.
bool kquant_pack_rows(const WeightView& w, int64_t r0, int64_t r1, void* out);

// y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]) (+= y), 1 <= n <= 32 (in launches of up to 8 rows of x),
// device layout. Weights decoded in registers to their exact f32 values, f32 products and sums in a fixed
// order (deterministic). cudaErrorInvalidValue for views it does not take.
cudaError_t gemv_kquant(const WeightView& w,  // [rows, cols], device layout
                        const float* x,       // [n, cols]
                        int n,
                        float* y,           // [n, rows]
                        const float* bias,  // [rows] or null
                        bool accumulate, cudaStream_t stream);

// Timing experiments (bench_cuda_kernels --only kquant): the one-row tile, R rows per warp and U units in
// flight per lane, as the number 10 R + U (11, 12, 14, 21, 22, 24, 41, 42); 0: automatic.
void set_kquant_tile(int ru);
// The staged variant (gemv_kquant.cu: x copied to shared memory in the lanes' order, a few blocks per SM
// looping over the rows; n * cols * 4 <= 96 KB): 1 on, 0 off, -1 as ULTRA_CUDA_KQ_STAGE (default off: not yet
// timed on a GPU).
void set_kquant_stage(int on);

// The decode GEMV with int8 activations (llama.cpp's and the CPU's speed path, matmul_kquant_vnni.cpp): x
// quantised per 32 columns as the CPU's quantize_x_q8_ref does (d = max |x| / 127, q = x / d rounded to
// nearest even), then integer dot products of the codes with q (dp4a) per 16-column group: the result is
// the exact weights times q * d, summed in f32 (the CPU's int8 reference up to f32 rounding). Two launches
// (the quantisation, then the GEMV, launched programmatically when enabled: its first weight loads overlap
// the quantisation). ws: kquant_q8_ws_bytes(n, cols) bytes of device scratch, 16-byte aligned.
// kquant_q8_ok: the view and n it takes (n <= 8, x of n * cols * 1.5 bytes fits in shared memory).
size_t kquant_q8_ws_bytes(int n, int64_t cols);
bool kquant_q8_ok(const WeightView& w, int n);
cudaError_t gemv_kquant_q8(const WeightView& w,  // [rows, cols], device layout
                           const float* x,       // [n, cols]
                           int n,
                           float* y,           // [n, rows]
                           const float* bias,  // [rows] or null
                           bool accumulate, void* ws, size_t ws_bytes, cudaStream_t stream);
// Whether CudaMatmul::matmul takes the int8 GEMV for the block types' decode steps: set_kquant_int8 1 on,
// 0 off, -1 as ULTRA_CUDA_KQ_INT8 (kernel_tuning().kq_int8).
void set_kquant_int8(int on);
bool kquant_int8_on();

// out[r, c] = bf16(W[r, c]) (round to nearest even), out [rows, ld] BF16, ld = lowbit_bf16_ld(cols) (cols:
// a multiple of 32, so ld == cols), 16-byte aligned.
cudaError_t kquant_dequant_bf16(const WeightView& w, void* out, cudaStream_t stream);

}  // namespace ultra::cuda
