// GGUF block formats (core/quants.h) against llama.cpp's own ggml (tests/fixtures/quants/ggml_ref.bin, made
// by tools/make_quant_fixtures.sh): the size of every type id, and the scalar dequantisation of blocks ggml's
// quantiser wrote, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quants.h"
#include "quant_fixture.h"

namespace ultra {
namespace {

const test::QuantFixture& fixture() {
  static const test::QuantFixture fx = test::load_quant_fixture();
  return fx;
}

TEST(Quants, TypeSizesMatchGgml) {
  const auto& fx = fixture();
  ASSERT_TRUE(fx.error.empty()) << fx.error;
  int known = 0;
  for (size_t id = 0; id < fx.ggml_sizes.size(); ++id) {
    const auto [blck, bytes] = fx.ggml_sizes[id];
    const auto tt = type_traits(static_cast<GgmlType>(id));
    if (blck == 0) {  // an id ggml has retired
      EXPECT_FALSE(tt.has_value()) << "id " << id;
      continue;
    }
    ASSERT_TRUE(tt.has_value()) << "ggml type id " << id << " unknown to type_traits";
    EXPECT_EQ(tt->block_elems, (uint32_t)blck) << tt->name;
    EXPECT_EQ(tt->block_bytes, bytes) << tt->name;
    ++known;
  }
  EXPECT_GE(known, 35);
}

TEST(Quants, DequantizeIsBitExactWithGgml) {
  const auto& fx = fixture();
  ASSERT_TRUE(fx.error.empty()) << fx.error;
  ASSERT_GE(fx.types.size(), 14u);
  for (const auto& q : fx.types) {
    SCOPED_TRACE(std::string(type_name(q.type)));
    ASSERT_TRUE(is_block_quant(q.type));
    const auto tt = type_traits(q.type);
    ASSERT_TRUE(tt);
    ASSERT_EQ(q.row_bytes, row_bytes(*tt, fx.cols));
    std::vector<float> y(fx.cols);
    int mismatches = 0;
    for (uint32_t r = 0; r < fx.rows; ++r) {
      ASSERT_TRUE(dequantize(q.type, q.blocks.data() + r * q.row_bytes, fx.cols, y.data()));
      for (uint32_t c = 0; c < fx.cols; ++c) {
        const float want = q.dequant[(size_t)r * fx.cols + c];
        if (std::memcmp(&y[c], &want, 4) != 0 && mismatches++ < 5)
          ADD_FAILURE() << "row " << r << " col " << c << ": " << y[c] << " != ggml's " << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
    // The fixture's values are not all trivial: a type that dequantised everything to 0 would fail here.
    double energy = 0;
    for (float v : q.dequant) energy += (double)v * v;
    EXPECT_GT(energy, 1.0);
  }
}

TEST(Quants, NonFiniteScalesAreFound) {
  const auto& fx = fixture();
  ASSERT_TRUE(fx.error.empty()) << fx.error;
  for (const auto& q : fx.types) {
    SCOPED_TRACE(std::string(type_name(q.type)));
    const auto tt = type_traits(q.type);
    const int64_t nb = (int64_t)q.blocks.size() / tt->block_bytes;
    EXPECT_EQ(first_nonfinite_block(q.type, q.blocks.data(), nb), -1);
    if (q.type == GgmlType::MXFP4) continue;  // E8M0 has no non-finite code here
    std::vector<uint8_t> bad = q.blocks;
    uint8_t* b = bad.data() + 3 * tt->block_bytes;
    // the f16 / f32 scale's place in each layout
    size_t off = 0;
    if (q.type == GgmlType::Q2_K) off = offsetof(BlockQ2_K, d);
    if (q.type == GgmlType::Q3_K) off = offsetof(BlockQ3_K, d);
    if (q.type == GgmlType::Q6_K) off = offsetof(BlockQ6_K, d);
    if (q.type == GgmlType::Q8_K) {
      const float inf = INFINITY;
      std::memcpy(b, &inf, 4);
    } else {
      const uint16_t nan = 0x7e00;
      std::memcpy(b + off, &nan, 2);
    }
    EXPECT_EQ(first_nonfinite_block(q.type, bad.data(), nb), 3);
  }
}

}  // namespace
}  // namespace ultra
