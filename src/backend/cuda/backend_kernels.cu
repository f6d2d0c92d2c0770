// Small kernels of the CUDA backend's step (not forward ops): the device copy of each sequence's tokens, the
// tokens fed on the device, and the logit rules applied before the sampler.
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

constexpr int kRuleThreads = 1024;
constexpr int kRuleWords = 4096;  // mask words per chunk (131072 tokens; 16 KB of shared memory)

// One block per output row (logit_rules).
__global__ void __launch_bounds__(kRuleThreads)
    logit_rules_kernel(float* logits, int64_t ld, int n_sample, const SamplerRow* rows, int32_t* bad_out) {
  __shared__ RuleBias bias[kRuleMaxBias];
  __shared__ __align__(16) uint32_t mask[kRuleWords];
  const int k = blockIdx.x, tid = threadIdx.x;
  const uint32_t* allow = rows[k].allow;
  const RuleBias* hb = rows[k].bias;
  const int nb = min(max(rows[k].n_bias, 0), kRuleMaxBias);
  if (!allow && nb == 0) {
    if (tid == 0) bad_out[k] = 0;
    return;
  }
  float* l = logits + (int64_t)k * ld;
  bool bad = false;
  if (allow) {
    // By chunks of kRuleWords words: the chunk of the pinned mask into shared memory (16-byte loads over
    // the bus, all in flight at once), then its tokens, coalesced.
    const int n_words = (n_sample + 31) / 32;
    for (int c0 = 0; c0 < n_words; c0 += kRuleWords) {
      const int nw = min(kRuleWords, n_words - c0), n_vec = (nw + 3) / 4;
      for (int i = tid; i < n_vec; i += kRuleThreads)
        reinterpret_cast<uint4*>(mask)[i] = reinterpret_cast<const uint4*>(allow + c0)[i];
      __syncthreads();
      const int t_end = min(n_sample, (c0 + nw) * 32);
      for (int t = c0 * 32 + tid; t < t_end; t += kRuleThreads) {
        const float v = l[t];
        bad |= !isfinite(v);
        const int w = t / 32 - c0;
        if (!((mask[w] >> (t & 31)) & 1u)) l[t] = -INFINITY;
      }
      __syncthreads();
    }
  } else {
    for (int t = tid; t < n_sample; t += kRuleThreads) bad |= !isfinite(l[t]);
  }
  for (int j = tid; j < nb; j += kRuleThreads) bias[j] = hb[j];
  bad = __syncthreads_or(bad);  // also orders the masked logits and the bias list before the biases
  if (tid == 0) bad_out[k] = bad ? 1 : 0;
  // Each distinct token by the thread of its first entry, which applies all its entries in order.
  for (int j = tid; j < nb; j += kRuleThreads) {
    const int t = bias[j].token;
    if (t < 0 || t >= n_sample) continue;
    bool first = true;
    for (int i = 0; i < j && first; ++i) first = bias[i].token != t;
    if (!first) continue;
    float v = l[t];
    for (int i = j; i < nb; ++i)
      if (bias[i].token == t) v = bias[i].bias <= -100.0f ? -INFINITY : v + bias[i].bias;
    l[t] = v;
  }
}

}  // namespace

cudaError_t logit_rules(float* logits, int64_t ld, int n_sample, const SamplerRow* rows, int n_rows,
                        int32_t* bad, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  logit_rules_kernel<<<n_rows, kRuleThreads, 0, stream>>>(logits, ld, n_sample, rows, bad);
  return cudaGetLastError();
}

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
