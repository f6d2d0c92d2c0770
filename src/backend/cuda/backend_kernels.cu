// Small kernels of the CUDA backend's step (not forward ops): the device copy of each sequence's tokens.
#include "backend/cuda/backend_kernels.h"

namespace ultra::cuda {

namespace {

// log[seq[t] * n_ctx + pos[t]] = token[t] for the real rows (seq >= 0) of a step.
__global__ void token_log_write_kernel(int32_t* log, int n_ctx, int n_slots, const int32_t* token,
                                       const int32_t* pos, const int32_t* seq, int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int s = seq[t], p = pos[t];
  if (s < 0 || s >= n_slots || p < 0 || p >= n_ctx) return;
  log[(int64_t)s * n_ctx + p] = token[t];
}

}  // namespace

cudaError_t token_log_write(int32_t* log, int n_ctx, int n_slots, const int32_t* token, const int32_t* pos,
                            const int32_t* seq, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  token_log_write_kernel<<<(n + 127) / 128, 128, 0, stream>>>(log, n_ctx, n_slots, token, pos, seq, n);
  return cudaGetLastError();
}

}  // namespace ultra::cuda
