// Internal interface of the tiled prefill attention kernel (attention_prefill.cu) for attention.cu; not part
// of the launcher API (kernels.h describes the kernel).
#pragma once

#include "backend/cuda/kernels.h"

namespace ultra::cuda::detail {

// Whether the tiled kernel supports the cache (F16 / BF16, head_dim 64 or 128) with n_heads query heads;
// when it does, sets its shared-memory limits (call before capture) and *fallback_blocks to the number of
// fallback blocks per (kv head, head chunk). False when the device refuses the limits.
bool tiled_attention_setup(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                           int* fallback_blocks);

// The tiled kernel over n rows (plan.tiled; q and out 16-byte aligned; shapes checked by the caller).
cudaError_t tiled_attention(const AttentionPlan& plan, const KvLayerView& kv, const float* q, int n,
                            const int32_t* pos, const int32_t* seq, float scale, float* out,
                            cudaStream_t stream, const float* sinks = nullptr);

}  // namespace ultra::cuda::detail
