// Slotted static KV cache: size from the shape, O(1) crop (rollback) that gives the same logits as never
// having written the dropped tokens, independent slots, and a clear error instead of growth at capacity.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/session.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

double max_diff(const float* a, const float* b, int n) {
  double d = 0;
  for (int i = 0; i < n; ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

TEST(KvCache, SizeAndCropBounds) {
  KvCacheParams p;
  p.n_layers = 3;
  p.n_slots = 2;
  p.n_kv_heads = 4;
  p.max_ctx = 100;
  p.head_dim = 8;
  p.type = GgmlType::F16;
  KvCache kv(p);
  EXPECT_EQ(kv.bytes(), 2u * 3 * 2 * 4 * 100 * 8 * 2);
  kv.advance(1, 10);
  EXPECT_EQ(kv.n_tokens(1), 10);
  EXPECT_EQ(kv.n_tokens(0), 0);
  kv.crop(1, 4);
  EXPECT_EQ(kv.n_tokens(1), 4);
  EXPECT_THROW(kv.crop(1, 5), Error);  // cannot "crop" forward
  EXPECT_THROW(kv.crop(2, 0), Error);  // no such slot
  p.type = GgmlType::Q8_0;
  EXPECT_THROW(KvCache{p}, Error);
}

class KvSession : public ::testing::TestWithParam<GgmlType> {};

TEST_P(KvSession, CropThenContinueEqualsFreshRun) {
  auto m = load_model(kModel.string());
  const int V = m->hp.n_vocab;
  ContextParams cp;
  cp.n_ctx = 32;
  cp.n_slots = 2;
  cp.kv_type = GetParam();
  CpuBackend be(*m, cp);
  Session a(be, 0);
  const int32_t seq1[] = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  const int32_t seq2[] = {5, 9, 13, 17, 21, 100, 200, 300};
  a.prefill(seq1, 10);
  a.crop(5);  // drop 21..41 but keep the first five
  EXPECT_EQ(a.n_past(), 5);
  std::vector<float> rolled(V);
  a.prefill(seq2 + 5, 3);
  std::copy_n(be.logits(), V, rolled.data());

  Session b(be, 1);  // a fresh run of seq2 in the other slot
  b.prefill(seq2, 8);
  EXPECT_LT(max_diff(rolled.data(), be.logits(), V), 1e-5);

  // The slots did not disturb each other: decoding the same token in both gives the same logits.
  std::vector<float> la(V);
  std::copy_n(a.decode_one(7), V, la.data());
  EXPECT_LT(max_diff(la.data(), b.decode_one(7), V), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Types, KvSession, ::testing::Values(GgmlType::F32, GgmlType::F16));

TEST(KvSession, FullContextIsAnErrorNotAResize) {
  auto m = load_model(kModel.string());
  ContextParams cp;
  cp.n_ctx = 8;
  CpuBackend be(*m, cp);
  Session s(be, 0);
  const int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_THROW(s.prefill(t, 9), Error);
  EXPECT_EQ(s.n_past(), 0);
  s.prefill(t, 8);
  EXPECT_EQ(s.n_past(), 8);
  try {
    s.prefill(t, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
  EXPECT_EQ(be.kv().capacity(), 8);
}

}  // namespace
