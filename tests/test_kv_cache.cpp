// Slotted static KV cache: size from the shape, O(1) crop (rollback) that gives the same logits as never
// having written the dropped tokens, independent slots, and a clear error instead of growth at capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>

#include "kv/kv_cache.h"
#include "ultra/generate.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

double max_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

TEST(KvCache, SizeAndTypes) {
  KvCacheParams p;
  p.n_layers = 3;
  p.n_slots = 2;
  p.n_kv_heads = 4;
  p.max_ctx = 100;
  p.head_dim = 8;
  p.type = GgmlType::F16;
  KvCache kv(p);
  EXPECT_EQ(KvCache::buffer_bytes(p), 2u * 4 * 100 * 8 * 2);
  EXPECT_EQ(kv.bytes(), (size_t)2 << 20);  // 6 such buffers, in one mapping of whole 2 MiB pages
  EXPECT_EQ(kv.capacity(), 100);
  p.type = GgmlType::Q8_0;
  EXPECT_THROW(KvCache{p}, Error);
}

// One huge-page allocation holds every layer: 2 MiB-aligned, zeroed, and the K and V buffers of all layers
// disjoint (a writer running past its buffer would clobber the next layer), 64-byte aligned and writable.
TEST(KvCache, LayersAreDisjointZeroedAndAligned) {
  KvCacheParams p;
  p.n_layers = 5;
  p.n_slots = 3;
  p.n_kv_heads = 2;
  p.max_ctx = 37;  // an odd size: the buffers are not multiples of 64 bytes
  p.head_dim = 6;
  p.type = GgmlType::F32;
  KvCache kv(p);
  const size_t n = (size_t)p.n_slots * p.n_kv_heads * p.max_ctx * p.head_dim;
  EXPECT_EQ((uintptr_t)kv.layer(0).k % ((uintptr_t)2 << 20), 0u);
  // The footprint the planner is told is what is mapped: whole 2 MiB pages covering every 64-byte-rounded
  // buffer (n * 4 = 5328 bytes is 5376 rounded).
  EXPECT_EQ(KvCache::buffer_bytes(p), 5376u);
  EXPECT_EQ(kv.bytes(), (size_t)2 << 20);
  EXPECT_EQ((uint8_t*)kv.layer(p.n_layers - 1).v + KvCache::buffer_bytes(p) - (uint8_t*)kv.layer(0).k,
            (ptrdiff_t)(2 * p.n_layers * KvCache::buffer_bytes(p)));
  for (int il = 0; il < p.n_layers; ++il) {
    KvLayerView l = kv.layer(il);
    for (void* b : {l.k, l.v}) {
      EXPECT_EQ((uintptr_t)b % 64, 0u);
      const float* f = static_cast<const float*>(b);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(f[i], 0.0f) << il << " " << i;
    }
    // Fill this layer's K and V with their own marks.
    std::fill_n(static_cast<float*>(l.k), n, 1.0f + 2 * il);
    std::fill_n(static_cast<float*>(l.v), n, 2.0f + 2 * il);
  }
  for (int il = 0; il < p.n_layers; ++il) {
    KvLayerView l = kv.layer(il);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(static_cast<const float*>(l.k)[i], 1.0f + 2 * il) << il << " " << i;
      ASSERT_EQ(static_cast<const float*>(l.v)[i], 2.0f + 2 * il) << il << " " << i;
    }
  }
}

TEST(KvCache, CropBounds) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 16, .n_slots = 2});
  Batch b(16);
  const int32_t t[10] = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  prefill(ctx, b, 1, t);
  EXPECT_EQ(ctx.seq_len(1), 10);
  EXPECT_EQ(ctx.seq_len(0), 0);
  ctx.crop(1, 4);
  EXPECT_EQ(ctx.seq_len(1), 4);
  EXPECT_EQ(std::vector<int32_t>(ctx.seq_tokens(1).begin(), ctx.seq_tokens(1).end()),
            (std::vector<int32_t>{5, 9, 13, 17}));
  EXPECT_THROW(ctx.crop(1, 5), Error);   // cannot "crop" forward
  EXPECT_THROW(ctx.crop(2, 0), Error);   // no such sequence
  EXPECT_THROW(ctx.crop(0, -1), Error);  // negative
}

class KvSession : public ::testing::TestWithParam<KvType> {};

TEST_P(KvSession, CropThenContinueEqualsFreshRun) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 32, .n_slots = 2, .kv_type = GetParam()});
  Batch b(16);
  const int32_t seq1[] = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  const int32_t seq2[] = {5, 9, 13, 17, 21, 100, 200, 300};
  prefill(ctx, b, 0, seq1);
  ctx.crop(0, 5);  // drop 25..41 but keep the first five
  EXPECT_EQ(ctx.seq_len(0), 5);
  int row = prefill(ctx, b, 0, std::span(seq2).subspan(5), Output::logits);
  const auto l = ctx.logits(row);
  const std::vector<float> rolled(l.begin(), l.end());

  row = prefill(ctx, b, 1, seq2, Output::logits);  // a fresh run of seq2 in the other slot
  EXPECT_LT(max_diff(rolled, ctx.logits(row)), 1e-5);

  // The slots did not disturb each other: decoding the same token in both gives the same logits.
  b.clear();
  b.add(7, 8, 0, Output::logits);
  b.add(7, 8, 1, Output::logits);
  ctx.step(b);
  EXPECT_LT(max_diff(ctx.logits(0), ctx.logits(1)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Types, KvSession, ::testing::Values(KvType::f32, KvType::f16));

TEST(KvSession, FullContextIsAnErrorNotAResize) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 8});
  Batch b(16);
  const int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_THROW(prefill(ctx, b, 0, t), Error);
  EXPECT_EQ(ctx.seq_len(0), 0);  // the step that did not fit wrote nothing
  prefill(ctx, b, 0, std::span(t).first(8));
  EXPECT_EQ(ctx.seq_len(0), 8);
  try {
    prefill(ctx, b, 0, std::span(t).first(1));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

}  // namespace
