#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"

using namespace ultra;

// Every half value round-trips through float exactly, and float->half rounds to nearest (ties to even),
// checked against a float64 reference over all 65536 halves and their midpoints.
TEST(DType, Fp16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32((uint16_t)h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), (uint16_t)h) << h;
  }
}

TEST(DType, Fp16KnownValues) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even -> 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  // 1 + 2^-11 is a tie between 1 and 1+2^-10: to even (1.0)
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(DType, Fp16MidpointsRoundToEven) {
  // Midpoint between consecutive positive finite halves a, a+1 (as float64): must go to the even one.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = fp16_to_fp32((uint16_t)h), b = fp16_to_fp32((uint16_t)(h + 1));
    const float mid = (float)((a + b) / 2);  // exact in float: halves have 11 significant bits
    const uint16_t expect = (h % 2 == 0) ? (uint16_t)h : (uint16_t)(h + 1);
    ASSERT_EQ(fp32_to_fp16(mid), expect) << h;
  }
}

TEST(DType, Bf16) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is a tie between 1 and 1+2^-7: to even
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32((uint16_t)h);
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), (uint16_t)h);
    }
  }
}

TEST(DType, Traits) {
  auto q = type_traits(GgmlType::Q8_0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->block_elems, 32u);
  EXPECT_EQ(q->block_bytes, 34u);
  EXPECT_FALSE(type_traits((GgmlType)99));
}
