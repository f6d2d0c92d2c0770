// The CUDA backend's size plan (backend/cuda/size_plan.h) on the host, no device needed: every buffer's
// bytes against the shapes written out here, the buffers each kind of model allocates (the one-row fused
// buffers of every model, the expert buffers of a mixture-of-experts one, the shared expert's only with
// one), and the sums the memory check, the allocator and the footprint read. That the allocations follow the
// plan is test_cuda_backend's SizePlanIsWhatIsAllocated (on a device).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/size_plan.h"
#include "core/dtype.h"
#include "core/quants.h"
#include "kv/layout.h"

using namespace ultra;
using cuda::CudaSizePlan;

namespace {

HParams dense() {
  HParams hp;
  hp.n_vocab = 1000;
  hp.dim = 96;
  hp.n_layers = 3;
  hp.n_heads = 4;
  hp.n_kv_heads = 2;
  hp.head_dim = 40;  // q_dim 160 > dim: xb is q_dim wide
  hp.ffn_dim = 200;
  return hp;
}

HParams moe(int shexp) {
  HParams hp = dense();
  hp.ffn_dim = 0;
  hp.n_expert = 8;
  hp.n_expert_used = 2;
  hp.expert_ffn_dim = 64;
  hp.shexp_ffn_dim = shexp;
  return hp;
}

ContextParams params(int n_batch, int n_outputs, int n_ctx = 100, int n_slots = 3) {
  ContextParams p;
  p.backend = BackendKind::cuda;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_outputs = n_outputs;
  p.n_slots = n_slots;
  p.kv_type = KvType::f16;
  return p;
}

constexpr cuda::CudaSizeInputs kInputs{12345, 0, 4096, 777};

// bytes per label, summed, and the number of allocations per label.
struct Listing {
  std::map<std::string, size_t> bytes;
  std::map<std::string, int> count;
};
Listing list(const CudaSizePlan& s) {
  Listing l;
  s.each_device([&](const char* what, size_t b) {
    l.bytes[what] += b;
    ++l.count[what];
  });
  return l;
}

size_t aligned(size_t b) {
  return (b + 255) / 256 * 256;
}

}  // namespace

// MXFP4: a matrix outside the experts is expanded to BF16 at upload, exactly, for every E8M0 exponent and
// E2M1 code (the f32 dequantisation's bits, infinities included); experts keep 4.25 bits a weight in the
// expert kernels' layout (moe.h), and DeviceWeights::bytes(), which the size plan and the footprint take as
// the weights' size, counts that layout: the MXFP4 fixture's device weights are the dense (F32 experts)
// fixture's with each layer's three expert blocks in MXFP4 rows instead of F32 ones (the two fixtures are
// alike but for the experts).
TEST(CudaSizePlan, Mxfp4Weights) {
  std::vector<BlockMXFP4> blocks(256);
  for (int e = 0; e < 256; ++e) {
    blocks[e].e = (uint8_t)e;
    for (int j = 0; j < 16; ++j) blocks[e].qs[j] = (uint8_t)(j | ((15 - j) << 4));
  }
  const WeightView w{.type = GgmlType::MXFP4,
                     .data = blocks.data(),
                     .rows = 256,
                     .cols = 32,
                     .row_bytes = sizeof(BlockMXFP4)};
  std::vector<uint16_t> out(256 * 32, 0xdead);
  cuda::expand_mxfp4_rows(w, 0, 256, out.data());
  int bad = 0;
  for (int e = 0; e < 256; ++e) {
    float want[32];
    dequant_block(blocks[e], want);
    for (int i = 0; i < 32; ++i) {
      const float got = bf16_to_fp32(out[e * 32 + i]);
      if (std::memcmp(&got, &want[i], 4) != 0 && ++bad <= 5)
        ADD_FAILURE() << "exponent " << e << " element " << i << ": " << got << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0);

  const std::string hf = std::string(ULTRA_SOURCE_DIR) + "/tests/fixtures/hf/";
  const auto mx = load_model(hf + "gpt_oss_mxfp4"), dense = load_model(hf + "gpt_oss");
  ASSERT_EQ(mx->layers[0].gate_exps[0].type, GgmlType::MXFP4);
  ASSERT_EQ(dense->layers[0].gate_exps[0].type, GgmlType::F32);
  const HParams& hp = mx->hp;
  const size_t E = hp.n_expert, F = hp.expert_ffn_dim, D = hp.dim;
  EXPECT_EQ(cuda::moe_mxfp4_row_bytes(64), 48u);  // 32 bytes of codes, 2 exponents, padding to 16
  EXPECT_EQ(cuda::moe_mxfp4_row_bytes(2880), 1536u);
  EXPECT_EQ(cuda::moe_mxfp4_row_bytes(40), 0u);
  auto aligned = [](size_t b) { return DeviceAllocator::aligned(b); };
  const size_t f32_blocks = 2 * aligned(E * F * D * 4) + aligned(E * D * F * 4);
  const size_t mx_blocks = 2 * aligned(E * F * cuda::moe_mxfp4_row_bytes((int64_t)D)) +
                           aligned(E * D * cuda::moe_mxfp4_row_bytes((int64_t)F));
  const cuda::DeviceWeights dw_mx(*mx, 128), dw_dense(*dense, 128);
  EXPECT_EQ(dw_mx.bytes(), dw_dense.bytes() - (size_t)hp.n_layers * (f32_blocks - mx_blocks));
  const CudaSizePlan s = cuda::plan_cuda_sizes(hp, params(8, 8), {dw_mx.bytes(), 0, 0, 0});
  EXPECT_EQ(s.weights, dw_mx.bytes());
}

// The expert kernels' MXFP4 rows (moe.h): moe_pack_mxfp4_rows then the kernels' decoder (moe_mxfp4_value, the
// same function on the device) give dequant_block's values bit for bit, every column of random blocks of
// every exponent; padding zeroed; bad shapes refused.
TEST(CudaSizePlan, Mxfp4ExpertLayout) {
  const int rows = 256, cols = 96, nb = cols / 32;
  std::vector<BlockMXFP4> blocks((size_t)rows * nb);
  uint32_t state = 12345;
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].e = (uint8_t)(i / nb);  // row r: exponent r
    for (int j = 0; j < 16; ++j) blocks[i].qs[j] = (uint8_t)((state = state * 1664525u + 1013904223u) >> 24);
  }
  WeightView w{.type = GgmlType::MXFP4,
               .data = blocks.data(),
               .rows = rows,
               .cols = cols,
               .row_bytes = nb * sizeof(BlockMXFP4)};
  const size_t rb = cuda::moe_mxfp4_row_bytes(cols);
  ASSERT_EQ(rb, 64u);  // 48 bytes of codes, 3 exponents, padding
  std::vector<uint8_t> out(rows * rb, 0xee);
  ASSERT_TRUE(cuda::moe_pack_mxfp4_rows(w, 0, rows, out.data()));
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = out.data() + (size_t)r * rb;
    for (size_t pad = cols / 2 + nb; pad < rb; ++pad) bad += row[pad] != 0;
    for (int b = 0; b < nb; ++b) {
      float want[32];
      dequant_block(blocks[(size_t)r * nb + b], want);
      for (int i = 0; i < 32; ++i) {
        const int c = 32 * b + i, c0 = c / 8 * 8;
        uint32_t q;
        std::memcpy(&q, row + c0 / 2, 4);
        const float got = cuda::moe_mxfp4_value(q, row[cols / 2 + c0 / 32], c - c0);
        if (std::memcmp(&got, &want[i], 4) != 0 && ++bad <= 5)
          ADD_FAILURE() << "row " << r << " column " << c << ": " << got << " want " << want[i];
      }
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_FALSE(cuda::moe_pack_mxfp4_rows(w, 0, rows + 1, out.data()));
  w.type = GgmlType::Q8_0;
  EXPECT_FALSE(cuda::moe_pack_mxfp4_rows(w, 0, 1, out.data()));
}

TEST(CudaSizePlan, DenseModelBuffers) {
  const HParams hp = dense();
  const ContextParams p = params(64, 8);
  const CudaSizePlan s = cuda::plan_cuda_sizes(hp, p, kInputs);
  const size_t nb = 64, q = 160, kv = 80, ffn = 200;
  EXPECT_EQ(s.n_rows, 64);
  EXPECT_EQ(s.n_out, 32);  // the largest bucket, above n_outputs 8: a 32-row graph samples 32 outputs
  EXPECT_EQ(s.max_hist, 100);
  EXPECT_EQ(s.weights, 12345u);
  EXPECT_EQ(s.xb, 4 * nb * q);
  EXPECT_EQ(s.k, 4 * nb * kv);
  EXPECT_EQ(s.hb2, 4 * nb * ffn);
  EXPECT_EQ(s.logits, 4 * 32 * 1000u);
  EXPECT_EQ(s.qkv1, 4 * (q + 2 * kv));  // the fused one-row buffers are in the plan
  EXPECT_EQ(s.gu1, 4 * 2 * ffn);
  EXPECT_EQ(s.token_log, 4 * 3 * 100u);
  EXPECT_EQ(s.proposals, sizeof(cuda::SpecDist) * 3 * kProposalRing);
  EXPECT_EQ(s.matmul_ws, cuda::CudaMatmul::workspace_bytes(64, 200, 0));

  const Listing l = list(s);
  EXPECT_EQ(l.count.at("KV cache"), 2 * hp.n_layers);
  EXPECT_EQ(l.bytes.at("KV cache"), kv_cache_bytes(hp, 3, 100, KvType::f16, KvMemory::device));
  // x, xb, q, k, v, att, hb, hb2, out_x, qkv1, gu1
  EXPECT_EQ(l.count.at("activations"), 11);
  EXPECT_EQ(l.bytes.at("activations"), 4 * (nb * 96 + nb * q + nb * q + 2 * nb * kv + nb * q + 2 * nb * ffn +
                                            32 * 96 + q + 2 * kv + 2 * ffn));
  for (const char* moe_only :
       {"router logits", "expert choice", "expert weights", "shared expert", "expert scratch"})
    EXPECT_EQ(l.count.count(moe_only), 0u) << moe_only;
  EXPECT_EQ(l.bytes.at("attention workspace"), 4096u);
  EXPECT_EQ(l.bytes.at("sampler workspace"), 777u);
  EXPECT_EQ(l.bytes.at("linked tokens"), sizeof(cuda::LinkedTokens));

  // The allocator's sum: every buffer rounded up to 256 bytes.
  size_t sum = 0;
  int n = 0;
  s.each_device([&](const char*, size_t b) {
    sum += aligned(b);
    ++n;
  });
  EXPECT_EQ(s.device_bytes(), sum);
  EXPECT_EQ(s.device_allocs(), n);
  EXPECT_EQ(n, 1 + 2 * hp.n_layers + 11 + 1 /*logits*/ + 3 /*token log, link, proposals*/ + 3 /*workspaces*/ +
                   2 /*step IO*/);
  // Two sets of step IO blocks (inputs, results, logit rules) and the logits' download block.
  EXPECT_EQ(s.io.mask_words, 32u);  // vocabulary 1000: 32 words
  EXPECT_EQ(s.pinned_bytes(), 2 * (s.io.in_bytes + s.io.out_bytes + s.io.rules_bytes) + 4 * 32 * 1000u);
  const Footprint fp = s.footprint();
  EXPECT_EQ(fp.weights, aligned(12345));
  EXPECT_EQ(fp.kv, l.bytes.at("KV cache"));
  EXPECT_EQ(fp.weights + fp.kv + fp.scratch, s.device_bytes() + s.pinned_bytes());
}

TEST(CudaSizePlan, ExpertBuffers) {
  for (int shexp : {0, 48}) {
    SCOPED_TRACE(shexp);
    const HParams hp = moe(shexp);
    const CudaSizePlan s = cuda::plan_cuda_sizes(hp, params(40, 40), kInputs);
    const CudaSizePlan d = cuda::plan_cuda_sizes(dense(), params(40, 40), kInputs);
    const Listing l = list(s);
    EXPECT_EQ(l.bytes.at("router logits"), 4 * 40 * 8u);
    EXPECT_EQ(l.bytes.at("expert choice"), 4 * 40 * 2u);
    EXPECT_EQ(l.bytes.at("expert weights"), 4 * 40 * 2u);
    EXPECT_EQ(l.bytes.at("expert scratch"), cuda::moe_scratch_bytes(40, 2, 8, 64, 96));
    EXPECT_EQ(l.count.count("shared expert"), shexp ? 1u : 0u);
    if (shexp) {
      EXPECT_EQ(l.bytes.at("shared expert"), 4 * 40 * 96u);
    }
    EXPECT_EQ(s.device_allocs(), d.device_allocs() + (shexp ? 5 : 4));
    // The FFN activations are as wide as the widest FFN: the experts' (64) or the shared expert's (48).
    EXPECT_EQ(s.hb, 4 * 40 * 64u);
    EXPECT_EQ(s.gu1, 4 * 2 * 64u);
  }
}

TEST(CudaSizePlan, ShapesAndOptionalBuffers) {
  // n_batch 3: the largest bucket is 2, n_outputs 1 -> 2 output rows; the 3-row step is a prefill slot.
  CudaSizePlan s = cuda::plan_cuda_sizes(dense(), params(3, 1), {});
  EXPECT_EQ(s.n_out, 2);
  EXPECT_EQ(s.max_hist, 100);
  // No attention workspace (one split): not allocated.
  EXPECT_EQ(list(s).count.count("attention workspace"), 0u);
  // A long context: the penalty window stops at kMaxHistory.
  s = cuda::plan_cuda_sizes(dense(), params(8, 8, SamplingParams::kMaxHistory + 10, 1), {});
  EXPECT_EQ(s.max_hist, SamplingParams::kMaxHistory);
  // Low-bit prefill: the matmul workspace holds the largest BF16 copy.
  cuda::CudaSizeInputs in = kInputs;
  in.max_lowbit_elems = 1 << 20;
  EXPECT_EQ(cuda::plan_cuda_sizes(dense(), params(64, 8), in).matmul_ws,
            cuda::CudaMatmul::workspace_bytes(64, 200, 1 << 20));
}

TEST(CudaSizePlan, StepIoLayout) {
  const cuda::StepIoLayout l = cuda::StepIoLayout::make(5, 3, 1000);
  // Inputs: tokens, feeds, positions, sequences (5 rows), output rows and sampler rows (3), each 256-aligned.
  EXPECT_EQ(l.tok, 0u);
  EXPECT_EQ(l.feed, 256u);
  EXPECT_EQ(l.pos, 256u + aligned(5 * sizeof(TokenFeed)));
  EXPECT_EQ(l.srow, l.out_row + 256);
  EXPECT_EQ(l.in_bytes, l.srow + aligned(3 * sizeof(cuda::SamplerRow)));
  // Results: tokens, logprobs, top tokens and logprobs (kSamplerMaxProbs each), error flags (the sampler's
  // and the logit rules').
  EXPECT_EQ(l.top_logprob, l.top_token + aligned(3 * cuda::kSamplerMaxProbs * 4));
  EXPECT_EQ(l.rule_error, l.error + 256);
  EXPECT_EQ(l.out_bytes, l.rule_error + 256);
  EXPECT_EQ(l.out_bytes, 4 * 256 + 2 * aligned(3 * cuda::kSamplerMaxProbs * 4));
  // The logit rules' block: a 16-byte aligned mask row per output (ceil(vocab / 32) words rounded up to 4),
  // then the outputs' bias lists.
  const cuda::StepIoLayout v = cuda::StepIoLayout::make(5, 3, 1000);  // 32 words -> 32
  EXPECT_EQ(v.mask_words, 32u);
  EXPECT_EQ(cuda::StepIoLayout::make(5, 3, 1025).mask_words, 36u);  // 33 words -> 36
  EXPECT_EQ(v.bias_at, aligned(3 * 32 * 4));
  EXPECT_EQ(v.rules_bytes, v.bias_at + aligned(3 * SamplingParams::kMaxLogitBias * 8));
}
