// The block quantizers (core/quantize_blocks.h) against llama.cpp's own ggml:
// tests/fixtures/quants/ggml_ref.bin holds, per type, the blocks ggml_quantize_chunk wrote for a fixed input
// [4 x 512] without and with importance weights (tools/make_quant_fixtures.sh). Ours must be the same bytes,
// block for block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quantize_blocks.h"
#include "core/quants.h"
#include "quant_fixture.h"
#include "ultra/error.h"

namespace ultra {
namespace {

const test::QuantFixture& fixture() {
  static const test::QuantFixture fx = test::load_quant_fixture();
  return fx;
}

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                           GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,   GgmlType::Q5_K,
                           GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

// Blocks of ours that differ from ggml's, over the fixture's rows.
int differing_blocks(const test::QuantFixture& fx, const test::QuantFixtureType& q, bool with_imatrix,
                     int* total) {
  const auto tt = *type_traits(q.type);
  const std::vector<uint8_t>& want = with_imatrix ? q.blocks_imatrix : q.blocks;
  std::vector<uint8_t> got(want.size(), 0xAB);
  for (uint32_t r = 0; r < fx.rows; ++r)
    quantize_row(q.type, fx.input.data() + (size_t)r * fx.cols, fx.cols, got.data() + r * q.row_bytes,
                 with_imatrix ? fx.imatrix.data() : nullptr);
  const size_t nb = want.size() / tt.block_bytes;
  int bad = 0;
  for (size_t b = 0; b < nb; ++b) {
    if (std::memcmp(got.data() + b * tt.block_bytes, want.data() + b * tt.block_bytes, tt.block_bytes) == 0)
      continue;
    if (bad++ < 3) {
      std::vector<float> yg(tt.block_elems), yw(tt.block_elems);
      dequantize(q.type, got.data() + b * tt.block_bytes, tt.block_elems, yg.data());
      dequantize(q.type, want.data() + b * tt.block_bytes, tt.block_elems, yw.data());
      int first = 0;
      while (first < (int)tt.block_bytes &&
             got[b * tt.block_bytes + first] == want[b * tt.block_bytes + first])
        ++first;
      ADD_FAILURE() << type_name(q.type) << (with_imatrix ? " (imatrix)" : "") << ": block " << b
                    << " differs from ggml's from byte " << first;
    }
  }
  *total = (int)nb;
  return bad;
}

TEST(QuantizeBlocks, BytesEqualGgmlWithoutImportanceWeights) {
  const auto& fx = fixture();
  ASSERT_TRUE(fx.error.empty()) << fx.error;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(std::string(type_name(t)));
    const auto* q = fx.find(t);
    ASSERT_NE(q, nullptr);
    int total = 0;
    EXPECT_EQ(differing_blocks(fx, *q, false, &total), 0) << "of " << total;
  }
}

TEST(QuantizeBlocks, BytesEqualGgmlWithImportanceWeights) {
  const auto& fx = fixture();
  ASSERT_TRUE(fx.error.empty()) << fx.error;
  for (GgmlType t : kTypes) {
    if (t == GgmlType::Q8_K) continue;  // an activation type: no weights
    SCOPED_TRACE(std::string(type_name(t)));
    const auto* q = fx.find(t);
    ASSERT_NE(q, nullptr);
    // The weights must change something, or this test would not see them ignored.
    EXPECT_NE(q->blocks, q->blocks_imatrix);
    int total = 0;
    EXPECT_EQ(differing_blocks(fx, *q, true, &total), 0) << "of " << total;
  }
}

TEST(QuantizeBlocks, RefusesOtherTypesAndPartialBlocks) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(quantize_row(GgmlType::F16, x.data(), 512, out.data()), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, x.data(), 384, out.data()), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, x.data(), 48, out.data()), Error);
  EXPECT_NO_THROW(quantize_row(GgmlType::Q4_0, x.data(), 64, out.data()));
}

}  // namespace
}  // namespace ultra
