// The rank-order sums of the NCCL transport's all-reduce past 2 ranks (nccl_communicator.cpp): after an
// ncclAllGather, g [size, n] holds every rank's block; these sum each column in rank order on the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ultra::dist {

// x[i] = ((g[0 n + i] + g[1 n + i]) + ...) + g[(size - 1) n + i], in f32 (what the MPI transport computes).
cudaError_t rank_order_sum_f32(const float* g, int size, size_t n, float* x, cudaStream_t stream);
// The same over bf16 bit patterns: summed in f32, rounded once to nearest even (core/dtype.h's fp32_to_bf16).
cudaError_t rank_order_sum_bf16(const uint16_t* g, int size, size_t n, uint16_t* x, cudaStream_t stream);

}  // namespace ultra::dist
