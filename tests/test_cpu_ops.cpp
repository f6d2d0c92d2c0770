// Fast CPU kernels against their scalar references (and the references against formulas written here).
// Tolerances are derived in the comments; each is tight enough that dropping, duplicating or mis-indexing
// a single element of a row (or a position/head in attention) fails. The table of kernel-vs-reference cases
// over every kernel set is test_backend_ops (tests/op_cases.h); this file keeps the references against
// formulas, the exactness and thread-split properties, and the int8 kernels' own entry points.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "cpu_test_data.h"

using namespace ultra;
using namespace ultra::cpu;
using ultra::test::Cache;
using ultra::test::kGuard;
using ultra::test::make_weights;
using ultra::test::randn;
using ultra::test::weight_value;
using ultra::test::Weights;

namespace {

// Every matmul kernel set this CPU can run (scalar always, AVX2 and AVX-512 when present), so each is
// tested here whatever the run-time choice.
std::vector<const detail::MatmulKernels*> kernel_sets() {
  std::vector<const detail::MatmulKernels*> k = {&detail::matmul_kernels_scalar()};
  if (detail::cpu_has_avx2()) k.push_back(&detail::matmul_kernels_avx2());
  if (detail::cpu_has_avx512()) k.push_back(&detail::matmul_kernels_avx512());
  return k;
}

// Makes matmul() use one kernel set for the scope.
struct KernelOverride {
  explicit KernelOverride(const detail::MatmulKernels* k) { detail::set_matmul_kernels_override(k); }
  ~KernelOverride() { detail::set_matmul_kernels_override(nullptr); }
};

const GgmlType kTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0};

// Runs the fast matmul with guarded y and scratch buffers; checks the guards.
std::vector<float> run_matmul(ThreadPool& pool, const WeightView& w, const std::vector<float>& x, int nt,
                              const float* bias) {
  const size_t ns = matmul_scratch_floats(w, nt, pool.size());
  std::vector<float> scratch(ns + 16, kGuard);
  std::vector<float> y(w.rows * nt + 16, kGuard);
  matmul(pool, w, x.data(), nt, y.data(), bias, ns ? scratch.data() : nullptr);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(scratch[ns + i], kGuard) << "scratch overrun";
    EXPECT_EQ(y[w.rows * nt + i], kGuard) << "y overrun";
  }
  y.resize(w.rows * nt);
  // With scratch (the panel GEMM's x packed once per matmul) and without it (packed per row block): the
  // same tiles in the same order, so the same bits.
  if (ns) {
    std::vector<float> y2(w.rows * nt);
    matmul(pool, w, x.data(), nt, y2.data(), bias, nullptr);
    EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << "packed x != per-block x";
  }
  return y;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// quantize_row_q8_0: llama.cpp's reference, bit for bit.

TEST(Q8_0, KnownValues) {
  std::vector<float> x(4 * 32, 0.0f);
  // Block 0: amax = 127 -> d = 1, id = 1: q = roundf(x), ties away from zero (2.5 -> 3, -0.5 -> -1).
  const float b0[] = {127, -127, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, 3.4f, -3.6f, 0};
  std::copy(std::begin(b0), std::end(b0), x.begin());
  // Block 1: all zero -> d = 0, id = 0, q = 0.
  // Block 2: amax = 1 -> d = 1/127, stored as half 0x2008 (= 0.00787353515625); id = 1/d (f32).
  const float b2[] = {1.0f, -1.0f, 0.3f, -0.7f, 0.0f, 0.02f};
  std::copy(std::begin(b2), std::end(b2), x.begin() + 64);
  // Block 3: amax = 254 (at the end) -> d = 2, id = 0.5.
  for (int i = 0; i < 32; ++i) x[96 + i] = (float)(i * 8 - 2);  // -2 .. 246
  x[127] = -254.0f;
  BlockQ8_0 q[4];
  quantize_row_q8_0(x.data(), 128, q);
  EXPECT_EQ(q[0].d, 0x3c00);
  const int e0[] = {127, -127, 3, -3, 1, -1, 2, 3, -4, 0};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(q[0].qs[i], e0[i]) << i;
  for (int i = 10; i < 32; ++i) EXPECT_EQ(q[0].qs[i], 0);
  EXPECT_EQ(q[1].d, 0x0000);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[1].qs[i], 0);
  EXPECT_EQ(q[2].d, 0x2008);
  const int e2[] = {127, -127, 38, -89, 0, 3};  // 0.3*127 = 38.1, 0.7*127 = 88.9, 0.02*127 = 2.54
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q[2].qs[i], e2[i]) << i;
  EXPECT_EQ(q[3].d, fp32_to_fp16(2.0f));
  for (int i = 0; i < 31; ++i) EXPECT_EQ(q[3].qs[i], (int)std::round((i * 8 - 2) / 2.0)) << i;  // 4i - 1
  EXPECT_EQ(q[3].qs[0], -1);
  EXPECT_EQ(q[3].qs[31], -127);
}

// Against a literal transcription of ggml's quantize_row_q8_0_ref, on random data of several scales.
TEST(Q8_0, MatchesLlamaCppReference) {
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    const auto x = randn(32 * 50, 7, scale);
    std::vector<BlockQ8_0> q(50);
    quantize_row_q8_0(x.data(), (int64_t)x.size(), q.data());
    for (int i = 0; i < 50; ++i) {
      float amax = 0.0f;
      for (int j = 0; j < 32; j++) amax = std::max(amax, fabsf(x[i * 32 + j]));
      const float d = amax / ((1 << 7) - 1);
      const float id = d ? 1.0f / d : 0.0f;
      ASSERT_EQ(q[i].d, fp32_to_fp16(d));
      for (int j = 0; j < 32; ++j) ASSERT_EQ(q[i].qs[j], (int8_t)roundf(x[i * 32 + j] * id));
    }
  }
}

TEST(DequantRow, AllTypesExact) {
  for (GgmlType t : kTypes) {
    for (int64_t cols : {32, 96, 4128}) {
      auto w = make_weights(t, 5, cols, 11);
      std::vector<float> out(cols + 4, kGuard);
      for (int64_t r = 0; r < 5; ++r) {
        dequant_row(w.view, r, out.data());
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(out[c], (float)weight_value(w.view, r, c)) << c;
        for (int i = 0; i < 4; ++i) ASSERT_EQ(out[cols + i], kGuard);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// matmul

// The reference itself against a direct float64 evaluation (it is the oracle for everything below).
TEST(Matmul, RefMatchesDirectFormula) {
  for (GgmlType t : kTypes) {
    auto w = make_weights(t, 9, 96, 3);
    const auto x = randn(3 * 96, 4);
    const auto bias = randn(9, 5);
    std::vector<float> y(27);
    matmul_ref(w.view, x.data(), 3, y.data(), bias.data());
    for (int tk = 0; tk < 3; ++tk) {
      for (int r = 0; r < 9; ++r) {
        double s = bias[r];
        for (int c = 0; c < 96; ++c) s += weight_value(w.view, r, c) * x[tk * 96 + c];
        EXPECT_NEAR(y[tk * 9 + r], s, 1e-6 * std::fabs(s) + 1e-30);
      }
    }
  }
}

// The kernels of every set against matmul_ref over the weight types, shapes, tails, token and thread counts
// (with the Q8_0 block scales 2^-8 .. 2^8 and the float types' odd column counts): test_backend_ops's table,
// tests/op_cases.h, whose tol_matmul derives the bound used here, |y - ref| <= 1e-6 sqrt(cols) sum |w x|.

// Prefill of a matrix with few rows on several threads also splits the tokens (matmul.cpp's token_step:
// steps of whole 12-token tiles, the last taking the rest). Every output must stay within the f32 bound
// above and be bit-identical to the one-thread result (no split): a step that started at the wrong
// token, wrote the wrong rows of y, read the wrong packed tile or left tokens out fails one or the other.
TEST(Matmul, PrefillTokenSplitMatchesOneThread) {
  ThreadPool pools[4] = {ThreadPool(1), ThreadPool(3), ThreadPool(5), ThreadPool(8)};
  uint32_t seed = 900;
  for (GgmlType t : kTypes) {
    for (int64_t rows : {7, 130, 300}) {
      const int64_t cols = 96;
      auto w = make_weights(t, rows, cols, ++seed);
      for (int nt : {96, 100, 131, 257}) {
        const auto x = randn(nt * cols, ++seed);
        const auto bias = randn(rows, ++seed);
        std::vector<float> ref(rows * nt);
        matmul_ref(w.view, x.data(), nt, ref.data(), bias.data());
        std::vector<double> bound(rows * nt);  // each output's bound, computed once for every kernel set
        for (int tk = 0; tk < nt; ++tk)
          for (int64_t r = 0; r < rows; ++r) {
            double abs_sum = std::fabs(bias[r]);
            for (int64_t c = 0; c < cols; ++c)
              abs_sum += std::fabs(weight_value(w.view, r, c) * x[tk * cols + c]);
            bound[tk * rows + r] = 1e-6 * std::sqrt((double)cols) * abs_sum;
          }
        for (const auto* ks : kernel_sets()) {
          KernelOverride ko(ks);
          const auto y1 = run_matmul(pools[0], w.view, x, nt, bias.data());
          for (int tk = 0; tk < nt; ++tk)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_NEAR(y1[tk * rows + r], ref[tk * rows + r], bound[tk * rows + r])
                  << ks->name << " " << type_name(t) << " rows=" << rows << " nt=" << nt << " t=" << tk;
          for (int p = 1; p < 4; ++p) {
            const auto y = run_matmul(pools[p], w.view, x, nt, bias.data());
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(y[i], y1[i]) << ks->name << " " << type_name(t) << " rows=" << rows << " nt=" << nt
                                     << " threads=" << pools[p].size() << " i=" << i;
          }
        }
      }
    }
  }
}

// ---- the CPU backend's tuning (tuning.h): its one reader of the environment ----

// Each variable lands in its field: the on-by-default switches go off only for a value starting with '0',
// the off-by-default ones on for any other non-empty value. The process's own values are put back.
TEST(Tuning, ReadsTheEnvironment) {
  const char* names[] = {"ULTRA_NO_SIMD", "ULTRA_NO_AVX512", "ULTRA_Q8_INT8", "ULTRA_CPU_PANEL"};
  std::vector<std::pair<std::string, bool>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.emplace_back(v ? v : "", v != nullptr);
  }
  auto put = [&](const char* no_simd, const char* no_avx512, const char* q8, const char* panel) {
    const char* values[] = {no_simd, no_avx512, q8, panel};
    for (int i = 0; i < 4; ++i)
      if (values[i])
        setenv(names[i], values[i], 1);
      else
        unsetenv(names[i]);
    return read_cpu_tuning();
  };
  const CpuTuning unset = put(nullptr, nullptr, nullptr, nullptr);
  EXPECT_FALSE(unset.no_simd);
  EXPECT_FALSE(unset.no_avx512);
  EXPECT_TRUE(unset.q8_int8);
  EXPECT_TRUE(unset.panel_gemm);
  const CpuTuning off = put("1", "yes", "0", "0");
  EXPECT_TRUE(off.no_simd);
  EXPECT_TRUE(off.no_avx512);
  EXPECT_FALSE(off.q8_int8);
  EXPECT_FALSE(off.panel_gemm);
  const CpuTuning zero = put("0", "", "", "1");
  EXPECT_FALSE(zero.no_simd);
  EXPECT_FALSE(zero.no_avx512);
  EXPECT_TRUE(zero.q8_int8);
  EXPECT_TRUE(zero.panel_gemm);
  for (int i = 0; i < 4; ++i)
    if (saved[i].second)
      setenv(names[i], saved[i].first.c_str(), 1);
    else
      unsetenv(names[i]);
  // the kernel set follows the process's first reading
  if (cpu_tuning().no_simd) EXPECT_EQ(cpu::kernel_isa(), std::string("scalar"));
  if (cpu_tuning().no_avx512) EXPECT_NE(cpu::kernel_isa(), std::string("avx512"));
}

// ---- Q8_0 with int8 activations (the default on AVX512-VNNI CPUs; ULTRA_Q8_INT8=0 turns it off) ----

// The environment's wish: on when unset or empty, off only for a value starting with '0'. (The test
// programs set ULTRA_Q8_INT8=0 before main, tests/pin_exact_numerics.cpp, so they see the exact path.)
TEST(Matmul, Q8_0Int8Switch) {
  EXPECT_TRUE(detail::q8_int8_wanted(nullptr));
  EXPECT_TRUE(detail::q8_int8_wanted(""));
  EXPECT_TRUE(detail::q8_int8_wanted("1"));
  EXPECT_FALSE(detail::q8_int8_wanted("0"));
  const char* env = std::getenv("ULTRA_Q8_INT8");
  ASSERT_NE(env, nullptr) << "tests/pin_exact_numerics.cpp is not linked into this program";
  if (std::string(env) == "0") {
    detail::set_q8_int8_override(-1);
    EXPECT_FALSE(detail::q8_int8_enabled());
  }
  detail::set_q8_int8_override(1);
  EXPECT_EQ(detail::q8_int8_enabled(),
            detail::cpu_has_avx512_vnni() && cpu::kernel_isa() == std::string("avx512"));
  detail::set_q8_int8_override(-1);
}

// Q8_0 rows with block scales 2^-8 .. 2^8 and zero blocks (as op_cases.h's widescales), and an x with a zero
// block, a block 1000x larger than the rest, and one with a single non-zero value.
struct Int8Case {
  Weights w;
  std::vector<float> x;
};
Int8Case int8_case(int64_t rows, int64_t cols, uint32_t seed) {
  Int8Case c;
  c.w = make_weights(GgmlType::Q8_0, rows, cols, seed, 0, /*wide_q8_scales=*/true);
  c.x = randn(cols, seed + 1);
  ultra::test::add_x_blocks(c.x, cols);
  return c;
}

// The reference quantiser and kernel: every x within half a step of its int8 value, each block's largest
// |x| at +-127; the kernel's result within the activation quantisation's bound of the f32-exact product
// (sum over blocks of d_x / 2 * sum |w|), and far from it when a block takes its neighbour's scale.
TEST(Matmul, Q8_0Int8Reference) {
  for (int64_t cols : {32, 96, 160, 4128}) {
    for (int64_t rows : {1, 7, 33}) {
      Int8Case c = int8_case(rows, cols, (uint32_t)(cols * 13 + rows));
      const int64_t nb = cols / 32;
      std::vector<int8_t> xq(cols);
      std::vector<float> xd(nb);
      detail::quantize_x_q8_ref(c.x.data(), cols, xq.data(), xd.data());
      for (int64_t b = 0; b < nb; ++b) {
        int top = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t k = b * 32 + i;
          ASSERT_LE(std::abs((int)xq[k]), 127);
          top = std::max(top, std::abs((int)xq[k]));
          ASSERT_LE(std::fabs(c.x[k] - (double)xq[k] * xd[b]), 0.5 * xd[b] * (1 + 1e-5)) << k;
        }
        ASSERT_EQ(top, xd[b] > 0 ? 127 : 0) << b;
      }
      std::vector<float> exact(rows), y(rows);
      matmul_ref(c.w.view, c.x.data(), 1, exact.data(), nullptr);
      detail::MatmulArgs a{c.w.bytes.data(), c.w.view.row_bytes, rows, cols, c.x.data(), 1, y.data(),
                           nullptr};
      a.xq = xq.data();
      a.xd = xd.data();
      detail::matmul_q8_int8_ref(a, 0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        double bound = 0;
        for (int64_t k = 0; k < cols; ++k)
          bound += std::fabs(weight_value(c.w.view, r, k)) * 0.5 * xd[k / 32];
        ASSERT_NEAR(y[r], exact[r], bound * (1 + 1e-5) + 1e-30) << cols << " " << rows << " " << r;
      }
    }
  }
}

// The AVX512-VNNI quantiser gives the reference's bytes, and its kernel the reference's sums to f32
// accumulation rounding; rows split across the range as matmul() splits them.
TEST(Matmul, Q8_0Int8Vnni) {
  if (!detail::cpu_has_avx512_vnni())
    GTEST_SKIP() << "this CPU has no AVX512-VNNI: the int8 kernel is not run here";
  for (int64_t cols : {32, 96, 160, 4128}) {
    for (int64_t rows : {1, 7, 33}) {
      Int8Case c = int8_case(rows, cols, (uint32_t)(cols * 17 + rows));
      const int64_t nb = cols / 32;
      std::vector<int8_t> xq(cols), xq2(cols);
      std::vector<float> xd(nb), xd2(nb);
      detail::quantize_x_q8_ref(c.x.data(), cols, xq.data(), xd.data());
      detail::quantize_x_q8_vnni(c.x.data(), cols, xq2.data(), xd2.data());
      ASSERT_EQ(xq, xq2) << cols;
      ASSERT_EQ(xd, xd2) << cols;
      std::vector<float> ref(rows), y(rows + 1, kGuard), bias = randn(rows, 5);
      for (const float* b : {(const float*)nullptr, (const float*)bias.data()}) {
        detail::MatmulArgs a{c.w.bytes.data(), c.w.view.row_bytes, rows, cols, c.x.data(), 1, ref.data(), b};
        a.xq = xq.data();
        a.xd = xd.data();
        detail::matmul_q8_int8_ref(a, 0, rows);
        a.y = y.data();
        detail::matmul_q8_int8_vnni(a, 0, rows / 2);
        detail::matmul_q8_int8_vnni(a, rows / 2, rows);
        ASSERT_EQ(y[rows], kGuard);
        for (int64_t r = 0; r < rows; ++r) {
          double abs_sum = b ? std::fabs(b[r]) : 0;
          for (int64_t k = 0; k < cols; ++k)
            abs_sum += std::fabs(weight_value(c.w.view, r, k) * xq[k] * xd[k / 32]);
          ASSERT_NEAR(y[r], ref[r], 1e-6 * std::sqrt((double)cols) * abs_sum)
              << cols << " " << rows << " " << r;
        }
      }
    }
  }
}

// The int8 prefill GEMM against the reference token by token: panels of 32 and 16 rows and row tails, token
// tiles and tails (6 a tile), several column blocks (4128 columns are 129 blocks: 32 + 32 + 32 + 32 + 1),
// with and without bias, the rows split in two ranges; and the whole path through matmul() (the x packed
// once, the token split of a many-thread prefill) on 1, 3 and 8 threads.
TEST(Matmul, Q8_0Int8VnniGemm) {
  if (!detail::cpu_has_avx512_vnni())
    GTEST_SKIP() << "this CPU has no AVX512-VNNI: the int8 GEMM is not run here";
  if (detail::active_isa() != detail::Isa::Avx512)  // matmul() below takes the int8 path on AVX-512 only
    GTEST_SKIP() << "ULTRA_NO_AVX512 / ULTRA_NO_SIMD chose another kernel set: the int8 GEMM is not run";
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(3), ThreadPool(8)};
  for (int64_t cols : {32, 96, 4128}) {
    for (int64_t rows : {7, 16, 33, 130}) {
      Int8Case c = int8_case(rows, cols, (uint32_t)(cols * 19 + rows));
      const int64_t nb = cols / 32;
      for (int nt : {1, 2, 5, 6, 7, 13, 100}) {
        std::vector<float> x = randn(nt * cols, (uint32_t)(nt + cols));
        std::copy(c.x.begin(), c.x.end(), x.begin() + (nt - 1) * cols);  // the zero / large / sparse blocks
        const std::vector<float> bias = randn(rows, 9);
        // reference: each token quantised alone
        std::vector<float> ref(nt * rows);
        std::vector<int8_t> xq(cols);
        std::vector<float> xd(nb);
        for (int t = 0; t < nt; ++t) {
          detail::quantize_x_q8_ref(x.data() + t * cols, cols, xq.data(), xd.data());
          detail::MatmulArgs a{c.w.bytes.data(),      c.w.view.row_bytes, rows, cols, nullptr, 1,
                               ref.data() + t * rows, bias.data()};
          a.xq = xq.data();
          a.xd = xd.data();
          detail::matmul_q8_int8_ref(a, 0, rows);
        }
        // each output's bound, computed once for the four checks below
        std::vector<double> bound(nt * rows);
        for (int t = 0; t < nt; ++t) {
          detail::quantize_x_q8_ref(x.data() + t * cols, cols, xq.data(), xd.data());
          for (int64_t r = 0; r < rows; ++r) {
            double abs_sum = std::fabs(bias[r]);
            for (int64_t k = 0; k < cols; ++k)
              abs_sum += std::fabs(weight_value(c.w.view, r, k) * xq[k] * xd[k / 32]);
            bound[t * rows + r] = 1e-6 * std::sqrt((double)cols) * abs_sum;
          }
        }
        auto check = [&](const std::vector<float>& y, const char* what) {
          for (int t = 0; t < nt; ++t)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_NEAR(y[t * rows + r], ref[t * rows + r], bound[t * rows + r])
                  << what << " cols=" << cols << " rows=" << rows << " nt=" << nt << " t=" << t << " r=" << r;
        };
        const int tiles = (nt + detail::kQ8NT - 1) / detail::kQ8NT;
        std::vector<uint8_t> xp(tiles * nb * detail::kQ8TileBlockBytes + 64);
        uint8_t* xp0 = (uint8_t*)(((uintptr_t)xp.data() + 63) & ~(uintptr_t)63);
        detail::pack_x_q8_vnni(x.data(), nt, cols, 0, tiles, xp0);
        std::vector<float> y(nt * rows + 1, kGuard);
        detail::MatmulArgs a{c.w.bytes.data(), c.w.view.row_bytes, rows, cols, x.data(), nt,
                             y.data(),         bias.data()};
        a.xq = (const int8_t*)xp0;
        detail::matmul_q8_int8_gemm_vnni(a, 0, rows / 2);
        detail::matmul_q8_int8_gemm_vnni(a, rows / 2, rows);
        ASSERT_EQ(y[nt * rows], kGuard);
        check(y, "gemm");
        detail::set_q8_int8_override(1);
        for (auto& pool : pools) {
          std::vector<float> scratch(matmul_scratch_floats(c.w.view, nt, pool.size()));
          std::vector<float> y2(nt * rows);
          matmul(pool, c.w.view, x.data(), nt, y2.data(), bias.data(), scratch.data());
          check(y2, pool.size() == 1 ? "matmul 1 thread" : "matmul threads");
        }
        detail::set_q8_int8_override(-1);
      }
    }
  }
}

// A single non-zero activation (127) selects one weight column: every output is one product rounded once, so
// it must equal (float)(w * 127) exactly; a mis-indexed column or row in any tile/tail path is caught.
TEST(Matmul, OneHotColumnsExact) {
  ThreadPool pool(2);
  for (const auto* ks : kernel_sets())
    for (GgmlType t : kTypes) {
      KernelOverride ko(ks);
      const int64_t cols = 96, rows = 11;
      auto w = make_weights(t, rows, cols, 5);
      for (int nt : {1, 5, 16}) {
        for (int64_t c = 0; c < cols; ++c) {
          std::vector<float> x(nt * cols, 0.0f);
          for (int tk = 0; tk < nt; ++tk)
            x[tk * cols + (c + tk * 13) % cols] = 127.0f;  // each token a column
          const auto y = run_matmul(pool, w.view, x, nt, nullptr);
          for (int tk = 0; tk < nt; ++tk)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_EQ(y[tk * rows + r], (float)(127.0 * weight_value(w.view, r, (c + tk * 13) % cols)))
                  << ks->name << " " << type_name(t) << " c=" << c << " r=" << r << " tk=" << tk;
        }
      }
    }
}

// Large-magnitude and all-zero activation blocks.
TEST(Matmul, ZeroBlocks) {
  ThreadPool pool(2);
  for (const auto* ks : kernel_sets())
    for (GgmlType t : kTypes) {
      KernelOverride ko(ks);
      auto w = make_weights(t, 33, 768, 9);
      std::vector<float> x(768, 0.0f);
      for (int i = 32; i < 64; ++i) x[i] = 1000.0f * (i % 3 - 1);
      std::vector<float> ref(33);
      matmul_ref(w.view, x.data(), 1, ref.data(), nullptr);
      const auto y = run_matmul(pool, w.view, x, 1, nullptr);
      for (int r = 0; r < 33; ++r) {
        double abs_sum = 0;
        for (int c = 0; c < 768; ++c) abs_sum += std::fabs(weight_value(w.view, r, c) * x[c]);
        EXPECT_NEAR(y[r], ref[r], 1e-6 * std::sqrt(768.0) * abs_sum) << ks->name << " " << type_name(t);
      }
    }
}

// ---------------------------------------------------------------------------------------------------------
// rmsnorm, silu_mul

// Reference against float64 directly; fast path: the f32 sum of squares over 16 lanes has relative error
// ~u*sqrt(n/16) (<= u*(n/16+4) worst case, 1.6e-5 for n = 4128); the scale inherits half of it, plus ~3 ulp
// for sqrt/div/two products. Tolerance 4e-6 relative per element (+1e-30 for zeros).
TEST(RmsNorm, FastAndRef) {
  for (int n : {1, 7, 32, 96, 768, 4128}) {
    const int rows = 3;
    const auto x = randn(rows * n, n, 2.0f);
    const auto wt = randn(n, n + 1);
    std::vector<float> ref(rows * n), fast(rows * n + 8, kGuard);
    rmsnorm_ref(x.data(), wt.data(), rows, n, 1e-5f, ref.data());
    rmsnorm(x.data(), wt.data(), rows, n, 1e-5f, fast.data());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += (double)x[r * n + i] * x[r * n + i];
      const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int i = 0; i < n; ++i) {
        const double e = x[r * n + i] * scale * wt[i];
        ASSERT_NEAR(ref[r * n + i], e, 1e-7 * std::fabs(e) + 1e-30);
        ASSERT_NEAR(fast[r * n + i], e, 4e-6 * std::fabs(e) + 1e-30) << "n=" << n << " i=" << i;
      }
    }
    for (int i = 0; i < 8; ++i) ASSERT_EQ(fast[rows * n + i], kGuard);
  }
}

// silu(g)*u: the vector exp has relative error <= 2.5e-7, which enters sigmoid scaled by <= 1; the division
// and two products add 1 ulp each: relative tolerance 1e-6. Below g = -87.3 the fast path flushes to 0
// (true |value| <= 88 e^-88 |u| < 1e-36): absolute 1e-36.
TEST(SiluMul, FastAndRef) {
  for (int64_t n : {1, 7, 8, 33, 2048}) {
    auto g = randn(n, 1000 + n, 6.0f);
    const auto u = randn(n, 2000 + n);
    if (n > 8) {
      g[0] = 0.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = -87.0f, g[4] = 88.0f, g[5] = -1e-8f, g[6] = 30.0f;
      g[7] = -1e6f, g[8] = -20.0f;
    }
    std::vector<float> ref(n), fast(n + 8, kGuard);
    silu_mul_ref(g.data(), u.data(), n, ref.data());
    silu_mul(g.data(), u.data(), n, fast.data());
    for (int64_t i = 0; i < n; ++i) {
      const double e = (double)g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
      ASSERT_NEAR(ref[i], e, 1e-7 * std::fabs(e) + 1e-37);
      ASSERT_NEAR(fast[i], e, 1e-6 * std::fabs(e) + 1e-36) << "g=" << g[i];
    }
    for (int i = 0; i < 8; ++i) ASSERT_EQ(fast[n + i], kGuard);
  }
}

// ---------------------------------------------------------------------------------------------------------
// RoPE

namespace {

std::vector<float> inv_freqs(int head_dim, double base) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) f[i] = (float)(1.0 / std::pow(base, 2.0 * i / head_dim));
  return f;
}

// The float64 formula: angle (float)pos * inv_freq[i] rounded to f32 (as HF), cos/sin in double.
void rope_f64(std::vector<double>& x, int nt, int nh, int hd, const int32_t* pos, const float* inv,
              bool inter) {
  for (int t = 0; t < nt; ++t)
    for (int h = 0; h < nh; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const float theta = (float)pos[t] * inv[i];
        const int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + hd / 2;
        double* v = x.data() + ((size_t)t * nh + h) * hd;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * std::cos((double)theta) - x1 * std::sin((double)theta);
        v[b] = x0 * std::sin((double)theta) + x1 * std::cos((double)theta);
      }
}

}  // namespace

// Fast: f32 cosf/sinf (<= 1 ulp) and two products and a sum: |err| <= 3e-7 * (|x0| + |x1|) + rounding of
// the result; tolerance 1e-6 * (|x0| + |x1|) per element (positions up to 40000: angles to 4e4 rad).
TEST(Rope, BothModesAgainstFloat64) {
  for (bool inter : {true, false}) {
    for (int hd : {64, 128, 6}) {
      const int nt = 5, nh = 3;
      const int32_t pos[nt] = {0, 1, 17, 4095, 40000};
      const auto inv = inv_freqs(hd, 10000.0);
      const auto x0 = randn(nt * nh * hd, hd + inter);
      std::vector<double> e(x0.begin(), x0.end());
      rope_f64(e, nt, nh, hd, pos, inv.data(), inter);
      auto fast = x0, ref = x0;
      rope(fast.data(), nt, nh, hd, pos, inv.data(), inter);
      rope_ref(ref.data(), nt, nh, hd, pos, inv.data(), inter);
      for (int t = 0; t < nt; ++t)
        for (int h = 0; h < nh; ++h)
          for (int i = 0; i < hd / 2; ++i) {
            const int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + hd / 2;
            const size_t o = ((size_t)t * nh + h) * hd;
            const double mag = std::fabs(x0[o + a]) + std::fabs(x0[o + b]);
            for (int k : {a, b}) {
              ASSERT_NEAR(ref[o + k], e[o + k], 1e-7 * mag + 1e-30);
              ASSERT_NEAR(fast[o + k], e[o + k], 1e-6 * mag + 1e-30)
                  << "inter=" << inter << " hd=" << hd << " pos=" << pos[t] << " i=" << i;
            }
          }
      // position 0 is the identity
      for (int k = 0; k < nh * hd; ++k) ASSERT_EQ(fast[k], x0[k]);
    }
  }
}

// llama.cpp's convert permutes HF's Q/K rows per head: reshape (2, hd/2) then transpose, so that HF's
// rotate-half pairs (i, i + hd/2) become adjacent (2i, 2i+1). Rotate-half on the HF vector, permuted,
// must equal interleaved RoPE on the permuted vector.
TEST(Rope, RotateHalfEqualsInterleavedOnPermuted) {
  const int nt = 4, nh = 4, hd = 64;
  const int32_t pos[nt] = {3, 100, 511, 2047};
  const auto inv = inv_freqs(hd, 500000.0);
  const auto hf = randn(nt * nh * hd, 42);
  auto permute = [&](const std::vector<float>& v) {
    std::vector<float> p(v.size());
    for (int th = 0; th < nt * nh; ++th)
      for (int i = 0; i < hd / 2; ++i)
        for (int k = 0; k < 2; ++k) p[th * hd + 2 * i + k] = v[th * hd + k * (hd / 2) + i];
    return p;
  };
  auto a = hf;
  rope(a.data(), nt, nh, hd, pos, inv.data(), /*interleaved=*/false);
  const auto a_perm = permute(a);
  auto b = permute(hf);
  rope(b.data(), nt, nh, hd, pos, inv.data(), /*interleaved=*/true);
  double max_diff = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_NEAR(b[i], a_perm[i], 1e-6 * (std::fabs(a_perm[i]) + 1e-3)) << i;
    max_diff = std::max(max_diff, (double)std::fabs(b[i] - hf[i]));
  }
  EXPECT_GT(max_diff, 0.1);  // the rotation did something
}

// ---------------------------------------------------------------------------------------------------------
// KV cache and attention

TEST(KvWrite, LayoutAndF16Rounding) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    const int n_slots = 3, n_kv = 2, max_ctx = 50, hd = 20, nt = 4;
    Cache c(type, n_slots, n_kv, max_ctx, hd);
    const auto k = randn(nt * n_kv * hd, 1), v = randn(nt * n_kv * hd, 2);
    const int32_t pos[nt] = {0, 49, 7, 8};
    const int32_t slot[nt] = {2, 0, 1, 1};
    kv_write(c.view, k.data(), v.data(), nt, pos, slot);
    for (int t = 0; t < nt; ++t)
      for (int h = 0; h < n_kv; ++h)
        for (int i = 0; i < hd; ++i) {
          const size_t dst = (((size_t)slot[t] * n_kv + h) * max_ctx + pos[t]) * hd + i;
          const size_t src = ((size_t)t * n_kv + h) * hd + i;
          if (type == GgmlType::F32) {
            ASSERT_EQ(((float*)c.k.data())[dst], k[src]);
            ASSERT_EQ(((float*)c.v.data())[dst], v[src]);
          } else {
            ASSERT_EQ(((uint16_t*)c.k.data())[dst], fp32_to_fp16(k[src]));
            ASSERT_EQ(((uint16_t*)c.v.data())[dst], fp32_to_fp16(v[src]));
          }
        }
    // nothing else written
    size_t written = 0;
    const size_t n = (size_t)n_slots * n_kv * max_ctx * hd;
    for (size_t i = 0; i < n; ++i) {
      const bool nan =
          type == GgmlType::F32 ? std::isnan(((float*)c.k.data())[i]) : ((uint16_t*)c.k.data())[i] == 0x7e00;
      written += !nan;
    }
    EXPECT_EQ(written, (size_t)nt * n_kv * hd);
  }
}

// Attention with GQA (8 query heads on 2 kv heads), several slots with different histories, prefill-like
// batches and decode steps far into the cache, F32 and F16 caches, head_dim 64 and 20 (tails).
// Oracle 1: attention_ref, checked here against a float64 formula on the (f16-rounded) history arrays.
// Oracle tolerance for the fast path: out = sum_p a_p v_p with sum a_p = 1; score errors are
// <= ~u * hd * |q||k| * scale (~1e-6 here) plus the exp's 2.5e-7 relative error, each changing a_p
// relatively, so |out - ref| <= max|v| * (few 1e-6); tolerance 2e-5 * max|v|. An off-by-one position
// changes out by ~a_p*|v| ~ 1/n_pos ~ 1e-3 for 1000 positions.
TEST(Attention, GqaSlotsF32AndF16) {
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    for (int hd : {64, 20, 96, 128}) {
      for (float qscale : {1.0f, 6.0f}) {  // 6: scores up to ~100, exp would overflow without the max
        const int n_slots = 3, n_kv = 2, n_heads = 8, max_ctx = 1100;
        Cache c(type, n_slots, n_kv, max_ctx, hd);
        const int hist_len[n_slots] = {1024, 5, 1099};  // positions already in the cache per slot
        // History k/v per slot, as the test's own arrays (rounded to f16 for the F16 cache).
        std::vector<std::vector<float>> hk(n_slots), hv(n_slots);
        auto round_c = [&](float x) { return type == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(x)) : x; };
        for (int s = 0; s < n_slots; ++s) {
          hk[s] = randn((size_t)max_ctx * n_kv * hd, 10 + s);
          hv[s] = randn((size_t)max_ctx * n_kv * hd, 20 + s);
          // write in chunks of up to 64 tokens, like prefill batches
          for (int p0 = 0; p0 < hist_len[s]; p0 += 64) {
            const int n = std::min(64, hist_len[s] - p0);
            std::vector<int32_t> pos(n), slot(n, s);
            for (int i = 0; i < n; ++i) pos[i] = p0 + i;
            kv_write(c.view, hk[s].data() + (size_t)p0 * n_kv * hd, hv[s].data() + (size_t)p0 * n_kv * hd, n,
                     pos.data(), slot.data());
          }
          for (auto& x : hk[s]) x = round_c(x);
          for (auto& x : hv[s]) x = round_c(x);
        }
        // One step: 7 prefill tokens for slot 0 (pos 1024..1030: query tiles of 4 and 3 far into the cache),
        // 3 prefill tokens for slot 1 (pos 5..7), a decode token for slot 2 at the last position (1099).
        const int nt = 11;
        const int32_t pos[nt] = {1024, 1025, 1026, 1027, 1028, 1029, 1030, 5, 6, 7, 1099};
        const int32_t slot[nt] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2};
        std::vector<float> k(nt * n_kv * hd), v(nt * n_kv * hd);
        for (int t = 0; t < nt; ++t)
          for (int i = 0; i < n_kv * hd; ++i) {
            k[t * n_kv * hd + i] = hk[slot[t]][(size_t)pos[t] * n_kv * hd + i];  // already rounded: exact
            v[t * n_kv * hd + i] = hv[slot[t]][(size_t)pos[t] * n_kv * hd + i];
          }
        kv_write(c.view, k.data(), v.data(), nt, pos, slot);
        const auto q = randn(nt * n_heads * hd, 99, qscale);
        const float scale = 1.0f / std::sqrt((float)hd);
        std::vector<float> ref(nt * n_heads * hd);
        attention_ref(c.view, q.data(), nt, n_heads, pos, slot, scale, ref.data());

        // float64 formula on the history arrays (layout [pos][kv_head][hd]); kv head = h / 4.
        float vmax = 0;
        for (int t = 0; t < nt; ++t)
          for (int h = 0; h < n_heads; ++h) {
            const int kvh = h / (n_heads / n_kv), n_pos = pos[t] + 1;
            const float* qh = q.data() + ((size_t)t * n_heads + h) * hd;
            std::vector<double> sc(n_pos);
            double m = -INFINITY, sum = 0;
            for (int p = 0; p < n_pos; ++p) {
              double d = 0;
              for (int i = 0; i < hd; ++i)
                d += (double)qh[i] * hk[slot[t]][((size_t)p * n_kv + kvh) * hd + i];
              sc[p] = d * scale;
              m = std::max(m, sc[p]);
            }
            for (int p = 0; p < n_pos; ++p) sum += (sc[p] = std::exp(sc[p] - m));
            for (int i = 0; i < hd; ++i) {
              double o = 0;
              for (int p = 0; p < n_pos; ++p) {
                const float vv = hv[slot[t]][((size_t)p * n_kv + kvh) * hd + i];
                o += sc[p] * vv;
                vmax = std::max(vmax, std::fabs(vv));
              }
              ASSERT_NEAR(ref[((size_t)t * n_heads + h) * hd + i], o / sum, 1e-6 * vmax);
            }
          }

        // attention() (active_isa()), then each SIMD level this CPU has, forced.
        for (int level = -1; level <= (int)detail::Isa::Avx512; ++level) {
          if (level >= 0 && (level == (int)detail::Isa::Scalar || !detail::cpu_supports((detail::Isa)level)))
            continue;
          for (auto& pool : pools) {
            std::vector<float> scratch(attention_scratch_floats(max_ctx, pool.size()) + 16, kGuard);
            std::vector<float> out(nt * n_heads * hd + 16, kGuard);
            if (level < 0) {
              attention(pool, c.view, q.data(), nt, n_heads, pos, slot, scale, out.data(), scratch.data());
            } else {
              const detail::AttentionArgs args{&c.view,    q.data(),       nt,   n_heads, pos, slot, scale,
                                               out.data(), scratch.data(), 0.0f, 0};
              detail::attention_isa((detail::Isa)level, pool, args);
            }
            for (int i = 0; i < 16; ++i) {
              ASSERT_EQ(out[nt * n_heads * hd + i], kGuard);
              ASSERT_EQ(scratch[scratch.size() - 16 + i], kGuard);
            }
            for (size_t i = 0; i < ref.size(); ++i)
              ASSERT_NEAR(out[i], ref[i], 2e-5 * vmax)
                  << type_name(type) << " hd=" << hd << " qscale=" << qscale << " threads=" << pool.size()
                  << " level=" << level << " t=" << i / (n_heads * hd) << " h=" << i / hd % n_heads;
          }
        }
      }
    }
  }
}

// ---- Gemma 2/3 ops ----

// gelu_tanh(g) * u in f32 against float64: tanh (libm, ~1 ulp; or, on AVX2, sigmoid(2 y) through a vector exp
// of ~2 ulp) and ~6 f32 roundings: relative 2e-6, plus an absolute 1e-6 * |u| where the factor 1 + tanh(.)
// cancels (g << 0: the true value is tiny). n = 1001 covers the vector loop and its tail.
TEST(GeluMul, FastAndRef) {
  for (int64_t n : {1, 7, 33, 1001}) {
    auto g = randn(n, 3000 + n, 4.0f);
    const auto u = randn(n, 4000 + n);
    if (n > 8) g[0] = 0.0f, g[1] = -30.0f, g[2] = 30.0f, g[3] = -1e-7f, g[4] = 1e4f, g[5] = -1e4f;
    std::vector<float> ref(n), fast(n + 8, kGuard);
    gelu_mul_ref(g.data(), u.data(), n, ref.data());
    gelu_mul(g.data(), u.data(), n, fast.data());
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      const double e = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
      ASSERT_NEAR(ref[i], e, 1e-7 * std::fabs(e) + 1e-30);
      ASSERT_NEAR(fast[i], e, 2e-6 * std::fabs(e) + 1e-6 * std::fabs(u[i])) << "g=" << g[i];
    }
    for (int i = 0; i < 8; ++i) ASSERT_EQ(fast[n + i], kGuard);
  }
}

TEST(Softcap, FastAndRef) {
  for (int64_t n : {1, 9, 320}) {
    for (float cap : {30.0f, 50.0f, 0.5f}) {
      auto x = randn(n, 5000 + n, 40.0f);
      std::vector<float> ref = x, fast = x;
      softcap_ref(ref.data(), n, cap);
      softcap(fast.data(), n, cap);
      for (int64_t i = 0; i < n; ++i) {
        const double e = std::tanh((double)x[i] / cap) * cap;
        ASSERT_NEAR(ref[i], e, 1e-7 * std::fabs(e) + 1e-30);
        ASSERT_NEAR(fast[i], e, 1e-6 * cap) << "x=" << x[i] << " cap=" << cap;
        ASSERT_LE(std::fabs(fast[i]), cap);
      }
    }
  }
}

// RoPE's mscale (LongRoPE's attention factor) multiplies cos and sin: the result is mscale times the plain
// rotation, on both pairings.
TEST(Rope, MscaleScalesTheRotation) {
  const int n = 3, heads = 2, hd = 10;
  const int32_t pos[n] = {0, 5, 77};
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / hd);
  for (bool inter : {false, true}) {
    const auto x = randn(n * heads * hd, 77);
    std::vector<float> a = x, b = x, r = x;
    rope(a.data(), n, heads, hd, pos, inv.data(), inter);
    rope(b.data(), n, heads, hd, pos, inv.data(), inter, 1.25f);
    rope_ref(r.data(), n, heads, hd, pos, inv.data(), inter, 1.25f);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(b[i], 1.25f * a[i], 1e-6f * (1 + std::fabs(a[i])));
      ASSERT_NEAR(r[i], b[i], 1e-5f * (1 + std::fabs(b[i])));
    }
  }
}

// Soft-capped scores and sliding windows: the fast kernel and the reference against a float64 formula over
// odd sizes, windows of 1, shorter than and longer than the positions (12: the Mistral fixture's), with and
// without soft-capping.
TEST(Attention, SoftcapAndSlidingWindow) {
  ThreadPool pool(3);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    const int n_kv = 2, n_heads = 6, hd = 18, max_ctx = 70, len = 61;
    Cache c(type, 1, n_kv, max_ctx, hd);
    auto round_c = [&](float x) { return type == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(x)) : x; };
    auto hk = randn((size_t)len * n_kv * hd, 31, 3.0f), hv = randn((size_t)len * n_kv * hd, 32);
    for (auto& x : hk) x = round_c(x);
    for (auto& x : hv) x = round_c(x);
    std::vector<int32_t> all_pos(len), all_slot(len, 0);
    for (int i = 0; i < len; ++i) all_pos[i] = i;
    kv_write(c.view, hk.data(), hv.data(), len, all_pos.data(), all_slot.data());
    // Query tiles (consecutive positions) of 4, 4 and 2 tokens, and lone tokens, against each window.
    const int nt = 11;
    const int32_t pos[nt] = {0, 1, 2, 3, 38, 39, 40, 41, 42, 43, 60};
    const int32_t slot[nt] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const auto q = randn(nt * n_heads * hd, 33, 3.0f);
    const float scale = 0.3f;
    for (int window : {0, 1, 6, 12, 41, 100}) {
      for (float cap : {0.0f, 5.0f}) {
        std::vector<float> ref(nt * n_heads * hd), out(nt * n_heads * hd + 16, kGuard);
        std::vector<float> scratch(attention_scratch_floats(max_ctx, pool.size()));
        attention_ref(c.view, q.data(), nt, n_heads, pos, slot, scale, ref.data(), cap, window);
        attention(pool, c.view, q.data(), nt, n_heads, pos, slot, scale, out.data(), scratch.data(), cap,
                  window);
        for (int t = 0; t < nt; ++t)
          for (int h = 0; h < n_heads; ++h) {
            const int kvh = h / (n_heads / n_kv);
            const int first = window > 0 ? std::max(0, pos[t] - window + 1) : 0;  // i - j < window
            const float* qh = q.data() + ((size_t)t * n_heads + h) * hd;
            std::vector<double> sc(pos[t] + 1);
            double m = -INFINITY, sum = 0;
            for (int p = first; p <= pos[t]; ++p) {
              double d = 0;
              for (int i = 0; i < hd; ++i) d += (double)qh[i] * hk[((size_t)p * n_kv + kvh) * hd + i];
              sc[p] = d * scale;
              if (cap > 0) sc[p] = std::tanh(sc[p] / cap) * cap;
              m = std::max(m, sc[p]);
            }
            for (int p = first; p <= pos[t]; ++p) sum += (sc[p] = std::exp(sc[p] - m));
            for (int i = 0; i < hd; ++i) {
              double o = 0;
              for (int p = first; p <= pos[t]; ++p) o += sc[p] * hv[((size_t)p * n_kv + kvh) * hd + i];
              const size_t at = ((size_t)t * n_heads + h) * hd + i;
              ASSERT_NEAR(ref[at], o / sum, 1e-6) << "window " << window << " cap " << cap;
              ASSERT_NEAR(out[at], o / sum, 2e-5) << "window " << window << " cap " << cap << " t " << t;
            }
          }
        for (int i = 0; i < 16; ++i) ASSERT_EQ(out[nt * n_heads * hd + i], kGuard);
      }
    }
  }
}
