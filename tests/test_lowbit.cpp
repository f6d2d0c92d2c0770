// Low-bit weight formats and kernels: FP8 E4M3 codes against float64 formulas, encoding against a
// brute-force nearest-value search, ternary packing, TQ1_0 / TQ2_0 against fixtures made by llama.cpp's own
// reference C code (tools/make_tq_fixtures.sh), and the F8_E4M3 / TERNARY matmul kernels of every kernel set
// this CPU runs against a float64 reference written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/lowbit.h"
#include "core/ternary.h"
#include "model/lowbit_weights.h"
#include "model/model.h"

using namespace ultra;

namespace {

// The value of an E4M3 code, from the format's definition in float64 (NaN for S.1111.111).
double e4m3_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Nearest finite E4M3 code to v by exhaustive search; ties to the even code (mantissa LSB 0); magnitudes
// beyond 448 saturate.
uint8_t e4m3_nearest(double v) {
  if (std::isnan(v)) return std::signbit(v) ? 0xff : 0x7f;
  const bool neg = std::signbit(v);
  const double a = std::fabs(v);
  if (a >= 448) return neg ? 0xfe : 0x7e;
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(e4m3_value(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return (uint8_t)(best | (neg ? 0x80 : 0));
}

}  // namespace

TEST(Fp8, AllCodesDecodeExactly) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_value(c);
    const float got = fp8_e4m3_to_fp32((uint8_t)c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE(fp8_e4m3_is_nan((uint8_t)c));
      ++nans;
      continue;
    }
    EXPECT_EQ((double)got, want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;  // -0 included
    EXPECT_FALSE(fp8_e4m3_is_nan((uint8_t)c));
    EXPECT_EQ(fp32_to_fp8_e4m3(got), (uint8_t)c) << "round trip of code " << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_fp32(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8, EncodeRoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbouring codes (ties: to the even code), and points just either side.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1), mid = (lo + hi) / 2;
    const uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
    for (int s = 0; s < 2; ++s) {
      const float sign = s ? -1.0f : 1.0f;
      const uint8_t sb = s ? 0x80 : 0;
      EXPECT_EQ(fp32_to_fp8_e4m3(sign * (float)mid), even | sb) << "tie above code " << c;
      EXPECT_EQ(fp32_to_fp8_e4m3(sign * std::nextafter((float)mid, 0.0f)), c | sb) << c;
      EXPECT_EQ(fp32_to_fp8_e4m3(sign * std::nextafter((float)mid, INFINITY)), (c + 1) | sb) << c;
    }
  }
  // subnormals: steps of 2^-9; half the smallest rounds to 0 (even), 1.5 steps to 2 steps
  EXPECT_EQ(fp32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(fp32_to_fp8_e4m3(std::ldexp(1.5f, -9)), 0x02);
  EXPECT_EQ(fp32_to_fp8_e4m3(std::ldexp(7.5f, -9)),
            0x08);  // tie between 7 and 8 steps: 8 (the smallest normal)
  EXPECT_EQ(fp32_to_fp8_e4m3(-std::ldexp(1.0f, -30)), 0x80);
  // saturation: 448 is the largest finite value; 464 (the tie with the non-existent 480) and beyond clamp
  EXPECT_EQ(fp32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(463.99f), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(464.0f), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(fp32_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(fp32_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(fp8_e4m3_is_nan(fp32_to_fp8_e4m3(NAN)));
  EXPECT_TRUE(fp8_e4m3_is_nan(fp32_to_fp8_e4m3(-NAN)));
  // random floats over the whole range against the exhaustive search
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> ex(-14, 10);
  for (int i = 0; i < 200000; ++i) {
    const float v = (float)(std::ldexp(1.0, 0) * std::exp2(ex(rng))) * (rng() & 1 ? -1.0f : 1.0f);
    ASSERT_EQ(fp32_to_fp8_e4m3(v), e4m3_nearest(v)) << v;
  }
}

TEST(Fp8, QuantizeRowScaleIsAbsmaxOver448) {
  const float x[5] = {0.1f, -3.5f, 2.0f, 0.0f, 1e-4f};
  const float s = fp8_row_scale(x, 5);
  EXPECT_EQ(s, 3.5f / 448.0f);
  uint8_t q[5];
  quantize_row_fp8(x, 5, s, q);
  EXPECT_EQ(q[1], 0xfe);  // -absmax -> -448
  for (int i = 0; i < 5; ++i) EXPECT_EQ(q[i], e4m3_nearest((double)(x[i] / s))) << i;
  const float z[3] = {0, 0, 0};
  quantize_row_fp8(z, 3, fp8_row_scale(z, 3), q);
  EXPECT_EQ(q[0] | q[1] | q[2], 0);
}

TEST(Ternary, PackUnpackBitExact) {
  // element i at bits 2i..2i+1: 00 -> 0, 01 -> +1, 10 -> -1
  int8_t t[32] = {1, -1, 0, 1, 0, 0, -1, -1, 1, 1, 1, 1, 0, -1, 0, 1};
  for (int i = 16; i < 32; ++i) t[i] = (int8_t)((i % 3) - 1);
  uint32_t w[2];
  ternary_pack(t, 32, w);
  uint32_t want0 = 0;
  for (int i = 0; i < 16; ++i) want0 |= (t[i] == 1 ? 1u : t[i] == -1 ? 2u : 0u) << (2 * i);
  EXPECT_EQ(w[0], want0);
  EXPECT_EQ(w[0] & 0xf, 0x9u);            // t0 = +1 (01), t1 = -1 (10)
  EXPECT_EQ(w[0] >> 28, (1u << 2) | 0u);  // t14 = 0 (00), t15 = +1 (01)
  int8_t back[32];
  ternary_unpack(w, 32, back);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[i], t[i]) << i;
  // all 3^16 words would be slow; every word of random trits round-trips
  std::mt19937 rng(3);
  for (int k = 0; k < 10000; ++k) {
    uint32_t word = 0;
    for (int i = 0; i < 16; ++i) word |= (rng() % 3) << (2 * i);
    int8_t u[16];
    ternary_unpack(&word, 16, u);
    uint32_t again;
    ternary_pack(u, 16, &again);
    ASSERT_EQ(again, word);
    ASSERT_TRUE(ternary_word_valid(word));
  }
  EXPECT_FALSE(ternary_word_valid(0x3u));
  EXPECT_FALSE(ternary_word_valid(0xC0000000u));
  EXPECT_TRUE(ternary_word_valid(0xAAAAAAAAu));
  EXPECT_TRUE(ternary_word_valid(0x55555555u));
}

TEST(Ternary, QuantizeIsBitNetAbsmean) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 0.02f);
  std::vector<float> x(64);
  double sum = 0;
  for (auto& v : x) {
    v = nd(rng);
    sum += std::fabs(v);
  }
  x[5] = 0;
  const float s = ternary_scale(sum, 64);
  EXPECT_FLOAT_EQ(s, (float)(sum / 64));
  x[7] = 0.5f * s;   // tie: rounds to even (0)
  x[8] = -1.5f * s;  // rounds to -2, clamps to -1
  x[9] = 10 * s;
  std::vector<uint32_t> w(4);
  quantize_row_ternary(x.data(), 64, s, w.data());
  for (int i = 0; i < 64; ++i) {
    const double q = std::clamp(std::nearbyint((double)(x[i] / s)), -1.0, 1.0);
    EXPECT_EQ(ternary_trit(w[i / 16], i % 16), (int)q) << i;
  }
  EXPECT_EQ(ternary_trit(w[0], 7), 0);
  EXPECT_EQ(ternary_trit(w[0], 8), -1);
  EXPECT_EQ(ternary_trit(w[0], 9), 1);
  EXPECT_EQ(ternary_scale(0, 16), 1e-5f);
}

// ---- TQ1_0 / TQ2_0 against llama.cpp's reference code ----

namespace {

struct TqFixture {
  uint32_t n_rows = 0, n = 0, n_raw = 0;
  std::vector<float> x, d1, d2, rd1, rd2;
  std::vector<BlockTQ1_0> q1, r1;
  std::vector<BlockTQ2_0> q2, r2;
};

TqFixture read_fixture() {
  std::ifstream f("tests/fixtures/lowbit/tq_ref.bin", std::ios::binary);
  TqFixture t;
  char magic[4];
  f.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "TQFX");
  f.read((char*)&t.n_rows, 4);
  f.read((char*)&t.n, 4);
  auto rd = [&](auto& v, size_t count) {
    v.resize(count);
    f.read((char*)v.data(), count * sizeof(v[0]));
  };
  const size_t ne = (size_t)t.n_rows * t.n, nb = ne / 256;
  rd(t.x, ne);
  rd(t.q1, nb);
  rd(t.q2, nb);
  rd(t.d1, ne);
  rd(t.d2, ne);
  f.read((char*)&t.n_raw, 4);
  rd(t.r1, t.n_raw);
  rd(t.rd1, t.n_raw * 256);
  rd(t.r2, t.n_raw);
  rd(t.rd2, t.n_raw * 256);
  EXPECT_TRUE(f.good()) << "tests/fixtures/lowbit/tq_ref.bin is truncated";
  EXPECT_EQ(f.peek(), EOF);
  return t;
}

}  // namespace

TEST(TQ, QuantizeAndDequantizeMatchLlamaCppBitExactly) {
  const TqFixture t = read_fixture();
  ASSERT_EQ(t.n % 256, 0u);
  const size_t ne = (size_t)t.n_rows * t.n, nb = ne / 256;
  std::vector<BlockTQ1_0> q1(nb);
  std::vector<BlockTQ2_0> q2(nb);
  for (uint32_t r = 0; r < t.n_rows; ++r) {  // row by row, as the writer does
    quantize_row_tq1_0(&t.x[r * t.n], t.n, &q1[r * t.n / 256]);
    quantize_row_tq2_0(&t.x[r * t.n], t.n, &q2[r * t.n / 256]);
  }
  EXPECT_EQ(std::memcmp(q1.data(), t.q1.data(), nb * sizeof(BlockTQ1_0)), 0) << "TQ1_0 blocks differ";
  EXPECT_EQ(std::memcmp(q2.data(), t.q2.data(), nb * sizeof(BlockTQ2_0)), 0) << "TQ2_0 blocks differ";
  std::vector<float> d(ne);
  dequantize_row_tq1_0(t.q1.data(), ne, d.data());
  EXPECT_EQ(std::memcmp(d.data(), t.d1.data(), ne * 4), 0);
  dequantize_row_tq2_0(t.q2.data(), ne, d.data());
  EXPECT_EQ(std::memcmp(d.data(), t.d2.data(), ne * 4), 0);
  // arbitrary bytes (every TQ1_0 byte value; TQ2_0 code 3, which ggml reads as +2)
  std::vector<float> rd(t.n_raw * 256);
  dequantize_row_tq1_0(t.r1.data(), rd.size(), rd.data());
  EXPECT_EQ(std::memcmp(rd.data(), t.rd1.data(), rd.size() * 4), 0);
  dequantize_row_tq2_0(t.r2.data(), rd.size(), rd.data());
  EXPECT_EQ(std::memcmp(rd.data(), t.rd2.data(), rd.size() * 4), 0);
}

TEST(TQ, TritsAndRepackToTernary) {
  const TqFixture t = read_fixture();
  int8_t tr[256];
  for (size_t b = 0; b < t.q1.size(); ++b) {
    tq1_0_trits(t.q1[b], tr);
    const float d = fp16_to_fp32(t.q1[b].d);
    for (int j = 0; j < 256; ++j) ASSERT_EQ((float)tr[j] * d, t.d1[b * 256 + j]) << b << " " << j;
    ASSERT_TRUE(tq2_0_trits(t.q2[b], tr));
    for (int j = 0; j < 256; ++j) ASSERT_EQ((float)tr[j] * fp16_to_fp32(t.q2[b].d), t.d2[b * 256 + j]);
  }
  EXPECT_FALSE(tq2_0_trits(t.r2[0], tr)) << "code 3 must be refused";

  // prepare_lowbit: TQ2_0 / TQ1_0 -> TERNARY with one scale per 256 columns, same values
  for (GgmlType type : {GgmlType::TQ1_0, GgmlType::TQ2_0}) {
    ModelData m;
    WeightView w;
    w.type = type;
    w.data = type == GgmlType::TQ1_0 ? (const void*)t.q1.data() : (const void*)t.q2.data();
    w.rows = t.n_rows;
    w.cols = t.n;
    w.row_bytes = t.n / 256 * (type == GgmlType::TQ1_0 ? sizeof(BlockTQ1_0) : sizeof(BlockTQ2_0));
    const WeightView v = prepare_lowbit(m, w, "test");
    ASSERT_EQ(v.type, GgmlType::TERNARY);
    EXPECT_EQ(v.scale_group, 256);
    EXPECT_EQ(v.scale_row_stride, t.n / 256);
    std::vector<float> row(t.n);
    const std::vector<float>& want = type == GgmlType::TQ1_0 ? t.d1 : t.d2;
    for (int64_t r = 0; r < v.rows; ++r) {
      cpu::dequant_row(v, r, row.data());
      for (uint32_t c = 0; c < t.n; ++c) ASSERT_EQ(row[c], want[r * t.n + c]) << r << " " << c;
    }
  }
  // a TQ2_0 block with code 3 is refused at load
  ModelData m;
  WeightView bad{GgmlType::TQ2_0, t.r2.data(), 1, 256, sizeof(BlockTQ2_0)};
  try {
    prepare_lowbit(m, bad, "file.gguf: tensor 'x'");
    FAIL() << "accepted TQ2_0 code 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("code 3"), std::string::npos) << e.what();
  }
}

TEST(Ternary, InvalidCodeAndFp8NanRefusedAtLoad) {
  ModelData m;
  std::vector<uint32_t> words = {0x55555555u, 0x00000000u, 0x0000000Cu};  // word 2: element 1 = 11
  const float s = 1;
  WeightView w{GgmlType::TERNARY, words.data(), 1, 48, 12, &s, 48, 1};
  try {
    prepare_lowbit(m, w, "f.gguf: tensor 'blk.0.ffn_up.weight'");
    FAIL() << "accepted code 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid code 11"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up.weight"), std::string::npos) << e.what();
  }
  words[2] = 0x00000008u;  // element 1 = 10 (-1): fine
  EXPECT_NO_THROW(prepare_lowbit(m, w, "x"));
  std::vector<uint8_t> codes = {0x00, 0x7e, 0xfe, 0x7f};
  WeightView f{GgmlType::F8_E4M3, codes.data(), 1, 4, 4, &s, 4, 1};
  EXPECT_THROW(prepare_lowbit(m, f, "x"), Error);
  codes[3] = 0x01;
  EXPECT_NO_THROW(prepare_lowbit(m, f, "x"));
}

// ---- matmul ----

namespace {

std::vector<const cpu::detail::MatmulKernels*> kernel_sets() {
  std::vector<const cpu::detail::MatmulKernels*> k = {&cpu::detail::matmul_kernels_scalar()};
  if (cpu::detail::cpu_has_avx2()) k.push_back(&cpu::detail::matmul_kernels_avx2());
  if (cpu::detail::cpu_has_avx512()) k.push_back(&cpu::detail::matmul_kernels_avx512());
  return k;
}

struct KernelOverride {
  explicit KernelOverride(const cpu::detail::MatmulKernels* k) {
    cpu::detail::set_matmul_kernels_override(k);
  }
  ~KernelOverride() { cpu::detail::set_matmul_kernels_override(nullptr); }
};

// y = W x against float64 sums of the values given by value(r, c); the tolerance is a few f32 roundings of
// sum |w x| (the kernels accumulate in f32), tight enough that one dropped or doubled element fails.
template <class Value>
void check_matmul(const WeightView& w, Value value, uint32_t seed, const char* what) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  for (int nt : {1, 2, 3, 4, 5, 9}) {
    std::vector<float> x((size_t)nt * w.cols), bias(w.rows);
    for (auto& v : x) v = nd(rng);
    for (auto& v : bias) v = nd(rng);
    for (const float* b : {(const float*)nullptr, (const float*)bias.data()}) {
      std::vector<double> ref((size_t)nt * w.rows), mag((size_t)nt * w.rows);
      for (int t = 0; t < nt; ++t)
        for (int64_t r = 0; r < w.rows; ++r) {
          double s = b ? b[r] : 0, a = b ? std::fabs(b[r]) : 0;
          for (int64_t c = 0; c < w.cols; ++c) {
            const double p = value(r, c) * (double)x[t * w.cols + c];
            s += p;
            a += std::fabs(p);
          }
          ref[t * w.rows + r] = s;
          mag[t * w.rows + r] = a;
        }
      for (const auto* k : kernel_sets()) {
        KernelOverride o(k);
        for (int nth : {1, 3}) {
          ThreadPool pool(nth);
          std::vector<float> y((size_t)nt * w.rows + 8, 12345.0f);
          cpu::matmul(pool, w, x.data(), nt, y.data(), b, nullptr);
          for (int i = 0; i < 8; ++i) ASSERT_EQ(y[(size_t)nt * w.rows + i], 12345.0f) << "y overrun";
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_NEAR(y[i], ref[i], 1e-5 * mag[i] + 1e-30)
                << what << " " << k->name << " rows " << w.rows << " cols " << w.cols << " tokens " << nt
                << " i " << i;
        }
      }
    }
  }
}

}  // namespace

TEST(LowbitMatmul, Fp8AgainstFloat64) {
  std::mt19937 rng(5);
  struct Shape {
    int64_t rows, cols, group, stride;  // stride 0: one scale per tensor; group < cols: HF block-wise
  };
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 5, 7, 37})
    for (int64_t cols : {1, 7, 16, 33, 64, 100, 259}) shapes.push_back({rows, cols, cols, 1});
  for (Shape sh : {Shape{3, 100, 100, 0}, Shape{5, 256, 128, 2}, Shape{7, 300, 128, 3}, Shape{9, 200, 32, 7},
                   Shape{4, 40, 16, 3}})
    shapes.push_back(sh);
  for (const Shape& sh : shapes) {
    const int64_t rows = sh.rows, cols = sh.cols;
    std::vector<uint8_t> codes((size_t)(rows * cols));
    for (auto& c : codes) {
      do c = (uint8_t)rng();
      while (fp8_e4m3_is_nan(c));
    }
    std::vector<float> scale((size_t)std::max<int64_t>(1, rows * sh.stride));
    for (auto& s : scale) s = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -(int)(rng() % 12));
    const WeightView w{GgmlType::F8_E4M3, codes.data(), rows,     cols,
                       (size_t)cols,      scale.data(), sh.group, sh.stride};
    check_matmul(
        w,
        [&](int64_t r, int64_t c) {
          return e4m3_value(codes[r * cols + c]) * scale[r * sh.stride + c / sh.group];
        },
        (uint32_t)(rows * 1000 + cols), "fp8");
    std::vector<float> row(cols);  // dequant_row (embedding lookups) with the same scales
    for (int64_t r = 0; r < rows; ++r) {
      cpu::dequant_row(w, r, row.data());
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(row[c], (float)e4m3_value(codes[r * cols + c]) * scale[r * sh.stride + c / sh.group]);
    }
  }
}

TEST(LowbitMatmul, TernaryAgainstFloat64) {
  std::mt19937 rng(9);
  struct Shape {
    int64_t rows, cols, group, stride;  // stride 0: one scale per tensor
  };
  for (Shape sh : {Shape{1, 16, 16, 1}, Shape{5, 48, 48, 1}, Shape{7, 80, 80, 0}, Shape{37, 272, 272, 1},
                   Shape{3, 512, 256, 2}, Shape{9, 768, 256, 3}, Shape{4, 64, 16, 4}}) {
    const int64_t nw = sh.cols / 16;
    std::vector<uint32_t> words((size_t)(sh.rows * nw));
    std::vector<int> trits((size_t)(sh.rows * sh.cols));
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t c = 0; c < sh.cols; ++c) {
        const int t = (int)(rng() % 3) - 1;
        trits[r * sh.cols + c] = t;
        words[r * nw + c / 16] |= (t == 1 ? 1u : t == -1 ? 2u : 0u) << (2 * (c % 16));
      }
    std::vector<float> scale((size_t)std::max<int64_t>(1, sh.rows * sh.stride));
    for (auto& s : scale) s = 0.01f + (rng() % 1000) / 1000.0f;
    const WeightView w{GgmlType::TERNARY, words.data(), sh.rows,  sh.cols,
                       (size_t)nw * 4,    scale.data(), sh.group, sh.stride};
    check_matmul(
        w,
        [&](int64_t r, int64_t c) {
          return trits[r * sh.cols + c] * (double)scale[r * sh.stride + c / sh.group];
        },
        (uint32_t)(sh.rows * 1000 + sh.cols), "ternary");
  }
}
