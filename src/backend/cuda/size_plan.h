// Every buffer a CUDA backend allocates, sized once, before anything is allocated, from the model, the
// context's limits and the device-dependent plans: the memory check at construction, the allocations
// themselves (each takes its size from here) and footprint() all read this one plan. Pure arithmetic (no
// CUDA call), so its sums can be tested on any host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/step_io.h"
#include "kv/layout.h"
#include "model/hparams.h"
#include "ultra/context.h"

namespace ultra::cuda {

// The sizes that come from the weights' layout and the device's plans.
struct CudaSizeInputs {
  size_t weight_bytes = 0;       // DeviceWeights::bytes(): the one weight allocation
  int64_t max_lowbit_elems = 0;  // DeviceWeights::max_lowbit_bf16_elems(): the prefill matmuls' BF16 copy
  size_t attention_ws = 0;       // the largest AttentionPlan::workspace_bytes of the backend's plans
  size_t sampler_ws = 0;         // SamplerPlan::workspace_bytes
};

struct CudaSizePlan {
  int n_rows = 0;    // rows of the step buffers: n_batch
  int n_out = 0;     // output rows: max(n_outputs, the largest row bucket of at most n_batch rows)
  int max_hist = 0;  // longest penalty window: min(SamplingParams::kMaxHistory, n_ctx)
  KvLayout kv;       // the KV cache (kv/layout.h)
  StepIoLayout io;   // the step's input and result blocks (step_io.h)

  // Device buffers, in bytes, in the order they are allocated; "0 / not allocated" as noted.
  size_t weights = 0;    // DeviceWeights, one allocation
  size_t kv_buffer = 0;  // each of the 2 * n_layers K and V buffers: kv.buffer_bytes()
  // StepBuffers (model/forward.h), f32; nb = n_rows, q / kv: q_dim / kv_dim, ffn: the largest FFN width.
  size_t x = 0;            // [nb, dim]
  size_t xb = 0;           // [nb, max(dim, q_dim)]
  size_t q = 0;            // [nb, q_dim]
  size_t k = 0, v = 0;     // [nb, kv_dim] each
  size_t att = 0;          // [nb, q_dim]
  size_t hb = 0, hb2 = 0;  // [nb, ffn] each
  size_t out_x = 0;        // [n_out, dim]
  size_t logits = 0;       // [n_out, n_vocab]
  size_t qkv1 = 0;         // [q_dim + 2 kv_dim] the fused projection of one row
  size_t gu1 = 0;          // [2 ffn] the fused gate / up of one row
  // Mixture of experts only (not allocated for a dense model).
  bool moe = false;
  size_t router = 0;       // [nb, n_expert] f32
  size_t expert_ids = 0;   // [nb, n_expert_used] int32
  size_t expert_w = 0;     // [nb, n_expert_used] f32
  size_t shexp_out = 0;    // [nb, dim] f32; allocated only with a shared expert (0 otherwise)
  size_t moe_scratch = 0;  // moe_scratch_bytes(nb, ...)
  // The engine's state on the device.
  size_t token_log = 0;  // [n_slots, n_ctx] int32
  size_t linked = 0;     // one LinkedTokens
  size_t proposals = 0;  // [n_slots, kProposalRing] SpecDist
  // Workspaces.
  size_t matmul_ws = 0;     // CudaMatmul::workspace_bytes(nb, max(dim, q_dim, ffn), max_lowbit_elems)
  size_t attention_ws = 0;  // not allocated when 0
  size_t sampler_ws = 0;
  // The step IO blocks' device mirrors.
  size_t step_in = 0, step_out = 0;  // io.in_bytes, io.out_bytes

  // Pinned host memory: StepIo::kInFlight input, result and logit-rules blocks, and the logits' download
  // block.
  size_t pinned_logits = 0;  // [n_out, n_vocab] f32

  // f(what, bytes) for every device allocation, in order (what: the allocator's label).
  template <class F>
  void each_device(F&& f) const {
    f("weights", weights);
    for (int i = 0; i < 2 * kv.n_layers; ++i) f("KV cache", kv_buffer);
    for (size_t b : {x, xb, q, k, v, att, hb, hb2, out_x}) f("activations", b);
    f("logits", logits);
    f("activations", qkv1);
    f("activations", gu1);
    if (moe) {
      f("router logits", router);
      f("expert choice", expert_ids);
      f("expert weights", expert_w);
      if (shexp_out) f("shared expert", shexp_out);
      f("expert scratch", moe_scratch);
    }
    f("token log", token_log);
    f("linked tokens", linked);
    f("kept proposals", proposals);
    f("matmul workspace", matmul_ws);
    if (attention_ws) f("attention workspace", attention_ws);
    f("sampler workspace", sampler_ws);
    f("step inputs", step_in);
    f("step results", step_out);
  }
  // What the device allocator takes for them all (each rounded up to DeviceAllocator::kAlign), and how many.
  size_t device_bytes() const;
  int device_allocs() const;
  size_t pinned_bytes() const;
  // weights: the weight allocation; kv: kv_cache_bytes(kv, KvMemory::device); scratch: every other device
  // byte (alignment included) and the pinned host blocks. weights + kv + scratch = device_bytes() +
  // pinned_bytes().
  Footprint footprint() const;
};

CudaSizePlan plan_cuda_sizes(const HParams& hp, const ContextParams& p, const CudaSizeInputs& in);

}  // namespace ultra::cuda
