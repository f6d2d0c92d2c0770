// GGUF block formats (core/quants.h) against llama.cpp's own ggml (tests/fixtures/quants/ggml_ref.bin, made
// by tools/make_quant_fixtures.sh): the size of every type id, and the scalar dequantisation of blocks ggml's
// quantiser wrote, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quants.h"
#include "core/quants_iq.h"
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

// The grid i-quants (core/quants_iq.h) against tests/fixtures/quants/ggml_iq_ref.bin
// (tools/iq_fixture_main.c): ggml's blocks (quantised with importance weights, as these formats require) and
// its dequantisation of them, bit for bit; and a NaN scale found (IQ1_M's is spread over its scale words).
struct IqFixture {
  uint32_t rows = 0, cols = 0;
  struct Type {
    GgmlType type;
    uint64_t row_bytes;
    std::vector<uint8_t> blocks;
    std::vector<float> dequant;
  };
  std::vector<Type> types;
};
IqFixture load_iq_fixture() {
  IqFixture fx;
  FILE* f = std::fopen(ULTRA_SOURCE_DIR "/tests/fixtures/quants/ggml_iq_ref.bin", "rb");
  if (!f) return fx;
  uint32_t head[5];
  bool ok = std::fread(head, 4, 5, f) == 5 && head[0] == 0x51495155u && head[1] == 1;
  fx.rows = head[2];
  fx.cols = head[3];
  for (uint32_t i = 0; ok && i < head[4]; ++i) {
    IqFixture::Type t;
    uint32_t id;
    ok = std::fread(&id, 4, 1, f) == 1 && std::fread(&t.row_bytes, 8, 1, f) == 1;
    t.type = (GgmlType)id;
    t.blocks.resize(fx.rows * t.row_bytes);
    t.dequant.resize((size_t)fx.rows * fx.cols);
    ok = ok && std::fread(t.blocks.data(), 1, t.blocks.size(), f) == t.blocks.size() &&
         std::fread(t.dequant.data(), 4, t.dequant.size(), f) == t.dequant.size();
    if (ok) fx.types.push_back(std::move(t));
  }
  std::fclose(f);
  return fx;
}

TEST(Quants, GridIQuantsDequantizeBitExactWithGgml) {
  const IqFixture fx = load_iq_fixture();
  ASSERT_EQ(fx.types.size(), 7u) << "tests/fixtures/quants/ggml_iq_ref.bin missing or short";
  for (const auto& q : fx.types) {
    SCOPED_TRACE(std::string(type_name(q.type)));
    ASSERT_TRUE(is_block_weight_type(q.type));
    const auto tt = type_traits(q.type);
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
    double energy = 0;
    for (float v : q.dequant) energy += (double)v * v;
    EXPECT_GT(energy, 1.0);
    const int64_t nb = (int64_t)q.blocks.size() / tt->block_bytes;
    EXPECT_EQ(first_nonfinite_block(q.type, q.blocks.data(), nb), -1);
    std::vector<uint8_t> bad = q.blocks;
    uint8_t* b = bad.data() + 3 * tt->block_bytes;
    if (q.type == GgmlType::IQ1_M) {  // 0x7e00 in the top nibbles of the 4 scale words
      for (int k = 0; k < 4; ++k)
        b[48 + 2 * k + 1] = (uint8_t)((b[48 + 2 * k + 1] & 0x0f) | (((0x7e00 >> (4 * k)) & 0xf) << 4));
    } else {
      const uint16_t nan = 0x7e00;
      std::memcpy(b, &nan, 2);
    }
    EXPECT_EQ(first_nonfinite_block(q.type, bad.data(), nb), 3);
  }
}

// The expanded grids equal ggml's tables: the FNV-1a 64 hash of each one's little-endian bytes is the hash
// tools/gen_iq_grids.py took of ggml's own table. And the sign table is ggml's (its first row).
template <class G>
uint64_t grid_hash(const G& grid) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& e : grid)
    for (int8_t v : e) h = (h ^ (uint8_t)v) * 0x100000001b3ull;
  return h;
}
TEST(Quants, GridsAreGgmls) {
  EXPECT_EQ(grid_hash(kIq2xxsGrid), iq_packed::kIq2xxsHash);
  EXPECT_EQ(grid_hash(kIq2xsGrid), iq_packed::kIq2xsHash);
  EXPECT_EQ(grid_hash(kIq2sGrid), iq_packed::kIq2sHash);
  EXPECT_EQ(grid_hash(kIq3xxsGrid), iq_packed::kIq3xxsHash);
  EXPECT_EQ(grid_hash(kIq3sGrid), iq_packed::kIq3sHash);
  EXPECT_EQ(grid_hash(kIq1sGrid), iq_packed::kIq1sHash);
  const uint8_t ggml_signs[16] = {0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kIqSigns[i], ggml_signs[i]);
  EXPECT_EQ(kIqSigns[127], 255);
}

}  // namespace
}  // namespace ultra
