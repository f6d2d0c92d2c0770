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

// out[r, c] = bf16(W[r, c]) (round to nearest even), out [rows, ld] BF16, ld = lowbit_bf16_ld(cols) (cols:
// a multiple of 32, so ld == cols), 16-byte aligned.
cudaError_t kquant_dequant_bf16(const WeightView& w, void* out, cudaStream_t stream);

}  // namespace ultra::cuda
