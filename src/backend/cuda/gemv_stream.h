// The weight-streaming gemv for one row of activations (gemv_stream.cu), used by gemv.cu's dispatch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ultra::cuda::detail {

// y[rows] = W[rows, cols] . x[cols] (+ bias) (+= y) for F16 / BF16 weights, one block per SM streaming its
// share of the rows through shared memory with bulk copies. smem_budget: bytes of shared memory for the
// weight stages (0: the default). Returns cudaErrorNotSupported for shapes it does not take (other types,
// cols % 8 != 0 or cols > 16384, unaligned rows or x), before launching anything.
cudaError_t gemv_stream(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float* x, float* y, const float* bias, bool accumulate, int smem_budget,
                        cudaStream_t stream);

}  // namespace ultra::cuda::detail
