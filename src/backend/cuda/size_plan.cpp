#include "backend/cuda/size_plan.h"

#include <algorithm>

#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/moe.h"

namespace ultra::cuda {

CudaSizePlan plan_cuda_sizes(const HParams& hp, const ContextParams& p, const CudaSizeInputs& in) {
  CudaSizePlan s;
  s.n_rows = p.n_batch;
  s.n_out = std::max(p.n_outputs, StepGraphs::largest_bucket(s.n_rows));
  s.max_hist = std::min(SamplingParams::kMaxHistory, p.n_ctx);
  s.kv = kv_layout(hp, p.n_slots, p.n_ctx, p.kv_type);
  s.io = StepIoLayout::make(s.n_rows, s.n_out, hp.n_vocab);

  const size_t f = sizeof(float), nb = s.n_rows, no = s.n_out;
  const size_t q_dim = (size_t)hp.n_heads * hp.head_dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  const size_t ffn = hp.max_ffn_dim();  // the dense FFN's, the experts' or the shared expert's
  s.weights = in.weight_bytes;
  s.kv_buffer = s.kv.buffer_bytes();
  s.x = f * nb * hp.dim;
  s.xb = f * nb * std::max<size_t>(hp.dim, q_dim);
  s.q = f * nb * q_dim;
  s.k = s.v = f * nb * kv_dim;
  s.att = f * nb * q_dim;
  s.hb = s.hb2 = f * nb * ffn;
  s.out_x = f * no * hp.dim;
  s.logits = f * no * hp.n_vocab;
  s.qkv1 = f * (q_dim + 2 * kv_dim);
  s.gu1 = f * 2 * ffn;
  s.moe = hp.moe();
  if (s.moe) {
    const size_t k_used = hp.n_expert_used;
    s.router = f * nb * hp.n_expert;
    s.expert_ids = sizeof(int32_t) * nb * k_used;
    s.expert_w = f * nb * k_used;
    s.shexp_out = hp.shexp_ffn_dim ? f * nb * hp.dim : 0;
    s.moe_scratch = moe_scratch_bytes(s.n_rows, hp.n_expert_used, hp.n_expert, hp.expert_ffn_dim, hp.dim);
  }
  s.token_log = sizeof(int32_t) * (size_t)p.n_slots * p.n_ctx;
  s.linked = sizeof(LinkedTokens);
  s.proposals = sizeof(SpecDist) * (size_t)p.n_slots * kProposalRing;
  s.matmul_ws = CudaMatmul::workspace_bytes(
      s.n_rows, std::max<int64_t>({hp.dim, (int64_t)q_dim, (int64_t)ffn}), in.max_lowbit_elems);
  s.attention_ws = in.attention_ws;
  s.sampler_ws = in.sampler_ws;
  s.step_in = s.io.in_bytes;
  s.step_out = s.io.out_bytes;
  s.pinned_logits = f * no * hp.n_vocab;
  return s;
}

size_t CudaSizePlan::device_bytes() const {
  size_t sum = 0;
  each_device([&](const char*, size_t b) { sum += DeviceAllocator::aligned(b); });
  return sum;
}

int CudaSizePlan::device_allocs() const {
  int n = 0;
  each_device([&](const char*, size_t) { ++n; });
  return n;
}

size_t CudaSizePlan::pinned_bytes() const {
  return StepIo::kInFlight * (io.in_bytes + io.out_bytes + io.rules_bytes) + pinned_logits;
}

Footprint CudaSizePlan::footprint() const {
  Footprint fp;
  fp.weights = DeviceAllocator::aligned(weights);
  fp.kv = kv_cache_bytes(kv, KvMemory::device);
  fp.scratch = device_bytes() - fp.weights - fp.kv + pinned_bytes();
  return fp;
}

}  // namespace ultra::cuda
