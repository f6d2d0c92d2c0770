// Small kernels of the CUDA backend's step (not forward ops): the device copy of each sequence's tokens, and
// the tokens fed on the device.
#include "backend/cuda/backend_kernels.h"

#include <algorithm>
#include <cstdint>

namespace ultra::cuda {

namespace {

// log[seq[t] * n_ctx + pos[t]] = token[t] for the real rows (seq >= 0) of a step.
__global__ void token_log_write_kernel(int32_t* log, int n_ctx, int n_slots, int32_t* token,
                                       const TokenFeed* feed, const int32_t* pos, const int32_t* seq,
                                       const int32_t* prev, const LinkedTokens* link, int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int s = seq[t], p = pos[t];
  if (s < 0 || s >= n_slots || p < 0 || p >= n_ctx) return;
  int32_t tok = token[t];
  switch (feed[t]) {
    case TokenFeed::id:
      break;
    case TokenFeed::prev_output:
      token[t] = tok = prev[tok];
      break;
    case TokenFeed::linked_seq:
      token[t] = tok = tok < link->n_slots && p < link->n_ctx ? link->log[(int64_t)tok * link->n_ctx + p] : 0;
      break;
    case TokenFeed::linked_output:
      token[t] = tok = link->out[tok];
      break;
  }
  log[(int64_t)s * n_ctx + p] = tok;
}

__global__ void copy_kernel_k(int4* dst, const int4* src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

cudaError_t copy_kernel(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) return cudaErrorInvalidValue;
  const size_t n = bytes / 16;
  if (n == 0) return cudaSuccess;
  const int threads = 256, blocks = (int)std::min<size_t>((n + threads - 1) / threads, 64);
  copy_kernel_k<<<blocks, threads, 0, stream>>>(static_cast<int4*>(dst), static_cast<const int4*>(src), n);
  return cudaGetLastError();
}

cudaError_t token_log_write(int32_t* log, int n_ctx, int n_slots, int32_t* token, const TokenFeed* feed,
                            const int32_t* pos, const int32_t* seq, const int32_t* prev,
                            const LinkedTokens* link, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  token_log_write_kernel<<<(n + 127) / 128, 128, 0, stream>>>(log, n_ctx, n_slots, token, feed, pos, seq,
                                                              prev, link, n);
  return cudaGetLastError();
}

}  // namespace ultra::cuda
