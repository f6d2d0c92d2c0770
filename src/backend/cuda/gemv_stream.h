// The weight-streaming gemv for one row of activations (gemv_stream.cu), used by gemv.cu's dispatch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ultra::cuda::detail {

// What the kernel forms its x[cols] from, in shared memory, before the products: the op before the gemv
// fused into its prologue (no launch, no round trip through global memory for it).
struct StreamInput {
  enum Kind : int {
    plain,     // x as given
    rmsnorm,   // x = rmsnorm(src) * w, bit-identical to cuda::rmsnorm on one row
    silu_mul,  // x = silu(src) * w, bit-identical to cuda::silu_mul
  };
  Kind kind = plain;
  const float* w = nullptr;      // rmsnorm: the norm weights [cols]; silu_mul: up [cols]
  float eps = 0.0f;              // rmsnorm
  const int32_t* row = nullptr;  // rmsnorm: src is row *row of the given x (rows of cols floats; a negative
                                 // index: a zero row, as gather_rows), read on the device; null: row 0
};

// y[rows] = W[rows, cols] . x[cols] (+ bias) (+= y) for F16 / BF16 weights, and F8_E4M3 weights with one
// scale per row (scale[r * scale_row_stride]; stride 0: one per tensor) applied to each row's sum, one block
// per SM streaming its share of the rows through shared memory with bulk copies. smem_budget: bytes of
// shared memory for the weight stages (0: the default). Returns cudaErrorNotSupported for shapes it does not
// take (other types, cols % 8 != 0 (F8_E4M3: % 16) or cols > 16384, unaligned rows, x or in.w, F8_E4M3
// without scales), before launching anything.
cudaError_t gemv_stream(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float* x, float* y, const float* bias, bool accumulate, int smem_budget,
                        cudaStream_t stream, const StreamInput& in = {}, const float* scale = nullptr,
                        int64_t scale_row_stride = 0);

}  // namespace ultra::cuda::detail
