// Small kernels of the CUDA backend's step that are not forward ops (see kernels.h for those).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "model/token_feed.h"

namespace ultra::cuda {

// Another backend's state a step may read its tokens from (Backend::link), in device memory; null
// pointers while unlinked.
struct LinkedTokens {
  const int32_t* log = nullptr;  // [n_slots, n_ctx] the source's token log
  const int32_t* out = nullptr;  // the tokens its last submitted step sampled, by output
  int32_t n_ctx = 0, n_slots = 0;
};

// Resolves the tokens the device feeds and writes the tokens of a step into the device copy of the
// sequences' tokens, which the sampler's penalty windows read. By feed[t] (model/forward.h TokenFeed), a
// token k fed prev_output becomes prev[k], the token the previous step sampled for its output k; s fed
// linked_seq becomes link->log[s, pos[t]] and k fed linked_output link->out[k] (written back into token[t],
// before the embedding reads it); then log[seq[t], pos[t]] = token[t]. Rows with seq < 0 (padding) are
// skipped.
cudaError_t token_log_write(int32_t* log,  // [n_slots, n_ctx]
                            int n_ctx, int n_slots,
                            int32_t* token,            // [n]
                            const TokenFeed* feed,     // [n]
                            const int32_t* pos,        // [n]
                            const int32_t* seq,        // [n]
                            const int32_t* prev,       // [outputs of the previous step]
                            const LinkedTokens* link,  // device memory
                            int n, cudaStream_t stream);

// dst[0, bytes) = src[0, bytes) by a kernel (16-byte words; bytes a multiple of 16, both 16-byte aligned),
// where one side may be pinned host memory (read or written over the bus by the kernel): a step's input
// upload and result download as kernel nodes instead of copy nodes in its graph.
cudaError_t copy_kernel(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// The logit rules of a step's output rows (SamplerRow::allow / bias / n_bias), before its sampler: for each
// row k < n_rows with rules, bad[k] = 1 when logits row k holds a NaN or infinity among its first n_sample
// entries (else 0), then each of those entries whose bit in allow is clear becomes -infinity, then the
// biases are applied in order to the tokens below n_sample (logit += bias; bias <= -100: -infinity):
// sampling/sampler.h's apply_logit_rules, the same operations in the same order. Rows without rules get
// bad[k] = 0 and keep their logits. One block per row; the mask is read from pinned host memory.
cudaError_t logit_rules(float* logits,  // [n_rows, ld]
                        int64_t ld, int n_sample,
                        const SamplerRow* rows,  // [n_rows] device memory
                        int n_rows,
                        int32_t* bad,  // [n_rows] device memory
                        cudaStream_t stream);

}  // namespace ultra::cuda
