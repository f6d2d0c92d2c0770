// The backend op harness (llama.cpp's test-backend-ops): every case of tests/op_cases.h (op, type, shape,
// tolerance rule) against the op's scalar reference on every CPU kernel set with a kernel for it:
//   scalar  the scalar matmul kernel set and attention loop; rope and softcap (one f32 kernel at every
//           level); gelu_mul's scalar f32 body (only when the process runs scalar, ULTRA_NO_SIMD=1)
//   avx2    matmul_kernels_avx2(), attention_thread_avx2, rmsnorm/silu_mul/gelu_mul_avx2, the F16 row
//           conversions (the AVX-512 level runs these element-wise AVX2 bodies too)
//   avx512  matmul_kernels_avx512(), attention_thread_avx512
//   vnni    Q8_0 and the block types with int8 activations through matmul(), decode and (Q8_0, Q4_K, Q6_K,
//           IQ4_XS) the int8 prefill GEMM (against quantize_x_q8_ref + matmul_q8_int8_ref or
//           matmul_kquant_int8_ref, token by token)
//           and the AVX512-VNNI activation quantiser (against quantize_x_q8_ref, bit for bit)
// A kernel set this CPU lacks is skipped with the reason. One test per (case, kernel set), named after both
// (e.g. Ops/BackendOps.Run/matmul_q8_0_r33_c4128_t17_avx512). Outputs carry guard values past their end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "core/fp8.h"
#include "core/ternary.h"
#include "core/thread_pool.h"
#include "cpu_test_data.h"
#include "op_cases.h"
#include "op_inputs.h"
#include "sanitized.h"

using namespace ultra;
using namespace ultra::cpu;
using ultra::test::add_x_blocks;
using ultra::test::AttentionInputs;
using ultra::test::case_name;
using ultra::test::Data;
using ultra::test::kGuard;
using ultra::test::Mag;
using ultra::test::Op;
using ultra::test::OpCase;
using ultra::test::randn;
using ultra::test::Tol;

namespace {

enum class Kset { Scalar, Avx2, Avx512, Vnni };
constexpr Kset kKsets[] = {Kset::Scalar, Kset::Avx2, Kset::Avx512, Kset::Vnni};

const char* kset_name(Kset k) {
  switch (k) {
    case Kset::Scalar:
      return "scalar";
    case Kset::Avx2:
      return "avx2";
    case Kset::Avx512:
      return "avx512";
    case Kset::Vnni:
      return "vnni";
  }
  return "?";
}

// Whether the op (for this case's type) has a kernel of its own in the set.
bool has_kernel(const OpCase& c, Kset k) {
  switch (c.op) {
    case Op::Matmul:
      return k != Kset::Vnni || c.type == GgmlType::Q8_0 ||
             (c.tokens == 1 ? detail::kquant_int8_vnni(c.type) : detail::kquant_int8_gemm_vnni(c.type)) !=
                 nullptr;
    case Op::Attention:
      return k != Kset::Vnni;
    case Op::RmsNorm:
    case Op::SiluMul:
    case Op::F16Convert:
      return k == Kset::Avx2;  // the scalar level runs the reference itself
    case Op::GeluMul:
      return k == Kset::Scalar || k == Kset::Avx2;
    case Op::Rope:
    case Op::Softcap:
      return k == Kset::Scalar;
    case Op::QuantizeQ8:
      return k == Kset::Vnni;
  }
  return false;
}

// Why the set cannot run here ("" when it can).
std::string unavailable(const OpCase& c, Kset k) {
  switch (k) {
    case Kset::Scalar:
      if (c.op == Op::GeluMul && detail::active_isa() != detail::Isa::Scalar)
        return "gelu_mul's scalar f32 body runs only in a scalar process (ULTRA_NO_SIMD=1)";
      return "";
    case Kset::Avx2:
      return detail::cpu_has_avx2() ? "" : "this CPU lacks AVX2+FMA+F16C";
    case Kset::Avx512:
      return detail::cpu_has_avx512() ? "" : "this CPU lacks AVX-512 F/BW/VL/DQ";
    case Kset::Vnni:
      if (!detail::cpu_has_avx512_vnni()) return "this CPU lacks AVX512-VNNI";
      if (c.op == Op::Matmul && detail::active_isa() != detail::Isa::Avx512)
        return "the int8-activation matmul runs only while the kernels run AVX-512 (ULTRA_NO_SIMD or "
               "ULTRA_NO_AVX512 is set)";
      return "";
  }
  return "?";
}

const detail::MatmulKernels& matmul_set(Kset k) {
  return k == Kset::Avx512 ? detail::matmul_kernels_avx512()
         : k == Kset::Avx2 ? detail::matmul_kernels_avx2()
                           : detail::matmul_kernels_scalar();
}

// ---- comparison

// Elements of y outside the case's rule around ref (mag: the op's magnitudes, Mag); reports the first few
// (with what) when report is set. Exact cases compare bits (both NaN matches).
int mismatches(const OpCase& c, const std::string& what, const float* y, const float* ref, const double* mag,
               size_t n, bool report = true) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double tol;
    const bool ok = ultra::test::within(c.tol, y[i], ref[i], mag ? mag[i] : 1.0, &tol);
    if (!ok && ++bad <= 5 && report)
      ADD_FAILURE() << what << " i=" << i << " y=" << y[i] << " ref=" << ref[i]
                    << " |diff|=" << std::fabs((double)y[i] - ref[i]) << " tol=" << tol;
  }
  return bad;
}

void expect_guard(const float* p, int n, const std::string& what) {
  for (int i = 0; i < n; ++i) EXPECT_EQ(p[i], kGuard) << what << ": written past the end";
}

// ---- matmul

struct MatmulData {
  std::unique_ptr<ultra::test::MatmulInputs> in;
  std::vector<float> ref;   // matmul_ref
  std::vector<double> mag;  // sqrt(cols) * (sum |w x| + |bias|)
};

std::unique_ptr<MatmulData> prepare_matmul(const OpCase& c) {
  auto d = std::make_unique<MatmulData>();
  d->in = ultra::test::matmul_inputs(c);
  const float* b = d->in->bias_ptr();
  d->ref.resize(c.rows * c.tokens);
  matmul_ref(d->in->wt.view, d->in->x.data(), c.tokens, d->ref.data(), b);
  d->mag = ultra::test::dot_magnitudes(d->in->wv, c.rows, c.cols, d->in->x.data(), c.tokens, b);
  return d;
}

// Cases run in order with their kernel sets in turn: the last case's data (weights, reference, magnitudes)
// is kept for the next set.
const MatmulData& matmul_data(const OpCase& c) {
  static const OpCase* last = nullptr;
  static std::unique_ptr<MatmulData> data;
  if (last != &c) {
    data = prepare_matmul(c);
    last = &c;
  }
  return *data;
}

// Makes matmul() use one kernel set (nullptr: its own choice) and Q8_0 int8 activations on (1) or as the
// environment says (-1), for the scope.
struct MatmulMode {
  MatmulMode(const detail::MatmulKernels* k, int q8_int8) {
    detail::set_matmul_kernels_override(k);
    detail::set_q8_int8_override(q8_int8);
  }
  ~MatmulMode() {
    detail::set_matmul_kernels_override(nullptr);
    detail::set_q8_int8_override(-1);
  }
};

// Runs matmul() with guarded y and scratch; with scratch (x packed once) and without it (packed per row
// block) the tiles are the same, so the bits are too (not for the int8 path, which needs the scratch).
std::vector<float> run_matmul(ThreadPool& pool, const WeightView& w, const float* x, int nt,
                              const float* bias, bool int8, const std::string& what) {
  const size_t ns = matmul_scratch_floats(w, nt, pool.size());
  std::vector<float> scratch(ns + 16, kGuard);
  std::vector<float> y(w.rows * nt + 16, kGuard);
  matmul(pool, w, x, nt, y.data(), bias, ns ? scratch.data() : nullptr);
  expect_guard(scratch.data() + ns, 16, what + " scratch");
  expect_guard(y.data() + w.rows * nt, 16, what + " y");
  y.resize(w.rows * nt);
  if (ns && !int8) {
    std::vector<float> y2(w.rows * nt);
    matmul(pool, w, x, nt, y2.data(), bias, nullptr);
    EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)))
        << what << ": packed x != per-block x";
  }
  return y;
}

// Mismatches of kernel set ks (nullptr with int8: the int8-activation path) over the case's thread counts.
int check_matmul(const OpCase& c, const detail::MatmulKernels* ks, bool int8, bool report) {
  const MatmulData& d = matmul_data(c);
  const ultra::test::MatmulInputs& in = *d.in;
  const float* b = in.bias_ptr();
  const std::vector<float>* ref = &d.ref;
  const std::vector<double>* mag = &d.mag;
  std::vector<float> ref8, xdq;
  std::vector<double> mag8;
  if (int8) {  // the reference of the int8 numerics, token by token
    const int64_t cols = c.cols, nb = cols / 32;
    ref8.resize(c.rows * c.tokens);
    xdq.resize(c.tokens * cols);
    std::vector<int8_t> xq(cols);
    std::vector<float> xd(nb);
    for (int t = 0; t < c.tokens; ++t) {
      detail::quantize_x_q8_ref(in.x.data() + t * cols, cols, xq.data(), xd.data());
      detail::MatmulArgs a{
          in.wt.bytes.data(), in.wt.view.row_bytes, c.rows, cols, nullptr, 1, ref8.data() + t * c.rows, b};
      a.xq = xq.data();
      a.xd = xd.data();
      if (c.type == GgmlType::Q8_0)
        detail::matmul_q8_int8_ref(a, 0, c.rows);
      else
        detail::matmul_kquant_int8_ref(c.type, a, 0, c.rows);
      for (int64_t i = 0; i < cols; ++i) xdq[t * cols + i] = xq[i] * xd[i / 32];
    }
    mag8 = ultra::test::dot_magnitudes(in.wv, c.rows, cols, xdq.data(), c.tokens, b);
    ref = &ref8;
    mag = &mag8;
  }
  MatmulMode mode(ks, int8 ? 1 : -1);
  int bad = 0;
  for (int nth : c.threads) {
    ThreadPool pool(nth);
    const std::string what = std::string(int8 ? "vnni" : ks->name) + " threads=" + std::to_string(nth);
    const auto y = run_matmul(pool, in.wt.view, in.x.data(), c.tokens, b, int8, what);
    bad += mismatches(c, what, y.data(), ref->data(), mag->data(), y.size(), report);
  }
  return bad;
}

// ---- element-wise ops

void run_rmsnorm(const OpCase& c, Kset) {
  const int rows = (int)c.rows, n = (int)c.cols;
  const auto x = randn(rows * n, c.seed, 2.0f), wt = randn(n, c.seed + 1);
  std::vector<float> ref(rows * n), y(rows * n + 8, kGuard);
  rmsnorm_ref(x.data(), wt.data(), rows, n, 1e-5f, ref.data());
  detail::rmsnorm_avx2(x.data(), wt.data(), rows, n, 1e-5f, y.data());
  expect_guard(y.data() + rows * n, 8, "rmsnorm");
  mismatches(c, "rmsnorm", y.data(), ref.data(), nullptr, ref.size());
}

void run_silu(const OpCase& c, Kset) {
  const int64_t n = c.cols;
  const auto g = ultra::test::gates(c, 6.0f), u = randn(n, c.seed + 1);
  std::vector<float> ref(n), y(n + 8, kGuard);
  silu_mul_ref(g.data(), u.data(), n, ref.data());
  detail::silu_mul_avx2(g.data(), u.data(), n, y.data());
  expect_guard(y.data() + n, 8, "silu_mul");
  mismatches(c, "silu_mul", y.data(), ref.data(), nullptr, n);
}

void run_gelu(const OpCase& c, Kset k) {
  const int64_t n = c.cols;
  const auto g = ultra::test::gates(c, 4.0f), u = randn(n, c.seed + 1);
  std::vector<float> ref(n), y(n + 8, kGuard);
  gelu_mul_ref(g.data(), u.data(), n, ref.data());
  if (k == Kset::Avx2)
    detail::gelu_mul_avx2(g.data(), u.data(), n, y.data());
  else
    gelu_mul(g.data(), u.data(), n, y.data());  // scalar process: its scalar body
  expect_guard(y.data() + n, 8, "gelu_mul");
  std::vector<double> mag(n);
  for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(u[i]);
  mismatches(c, "gelu_mul", y.data(), ref.data(), mag.data(), n);
}

void run_softcap(const OpCase& c, Kset) {
  const int64_t n = c.cols;
  const auto x = randn(n, c.seed, 40.0f);
  std::vector<float> ref = x, y = x;
  softcap_ref(ref.data(), n, c.param);
  softcap(y.data(), n, c.param);
  const std::vector<double> mag(n, c.param);
  mismatches(c, "softcap", y.data(), ref.data(), mag.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(y[i]), c.param) << "softcap above the cap";
}

// f32 -> f16 (F16C) against fp32_to_fp16, and f16 -> f32 against fp16_to_fp32, bit for bit: normal values,
// halves' subnormals, overflow to infinity, signed zeros, infinities, NaN; back, every code of a 65536 row.
void run_f16(const OpCase& c, Kset) {
  const int64_t n = c.cols;
  const auto x = ultra::test::f16_inputs(c);
  std::vector<uint16_t> h(n + 8, 0xabcd), href(n);
  detail::f32_to_f16_row_avx2(x.data(), h.data(), n);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    href[i] = fp32_to_fp16(x[i]);
    if (h[i] != href[i] && ++bad <= 5)
      ADD_FAILURE() << "f32->f16 x=" << x[i] << " " << h[i] << " != " << href[i];
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(h[n + i], 0xabcd) << "f32->f16 written past the end";
  std::vector<uint16_t> codes(n);
  std::mt19937 rng(c.seed);
  for (int64_t i = 0; i < n; ++i) codes[i] = n == 65536 ? (uint16_t)i : (uint16_t)rng();
  std::vector<float> y(n + 8, kGuard), ref(n);
  detail::f16_to_f32_row_avx2(codes.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ref[i] = fp16_to_fp32(codes[i]);
  expect_guard(y.data() + n, 8, "f16->f32");
  mismatches(c, "f16->f32", y.data(), ref.data(), nullptr, n);
}

void run_quantize_q8(const OpCase& c, Kset) {
  const int64_t n = c.cols, nb = n / 32;
  auto x = randn(n, c.seed);
  add_x_blocks(x, n);
  std::vector<int8_t> q(n + 8, 99), qref(n);
  std::vector<float> d(nb + 8, kGuard), dref(nb);
  detail::quantize_x_q8_ref(x.data(), n, qref.data(), dref.data());
  detail::quantize_x_q8_vnni(x.data(), n, q.data(), d.data());
  EXPECT_EQ(0, std::memcmp(q.data(), qref.data(), n)) << "int8 values differ from quantize_x_q8_ref";
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[n + i], 99) << "xq written past the end";
  expect_guard(d.data() + nb, 8, "xd");
  mismatches(c, "quantize_q8 scales", d.data(), dref.data(), nullptr, nb);
}

void run_rope(const OpCase& c, Kset) {
  const int nt = c.tokens, nh = (int)c.rows, hd = (int)c.cols;
  const auto in = ultra::test::rope_inputs(c);
  std::vector<float> ref = in.x, y = in.x;
  rope_ref(ref.data(), nt, nh, hd, in.pos.data(), in.inv.data(), c.interleaved, c.param);
  rope(y.data(), nt, nh, hd, in.pos.data(), in.inv.data(), c.interleaved, c.param);
  mismatches(c, "rope", y.data(), ref.data(), in.mag.data(), y.size());
}

// ---- attention

// The inputs of op_inputs.h, this step's rows written by the CPU's kv_write.
void run_attention(const OpCase& c, Kset k) {
  const int nh = (int)c.rows, nt = c.tokens;
  AttentionInputs in(c);
  kv_write(in.cache.view, in.k.data(), in.v.data(), nt, in.pos.data(), in.slot.data());
  std::vector<float> ref((size_t)nt * nh * c.cols);
  const float* sinks = c.sinks ? in.sinks.data() : nullptr;
  attention_ref(in.cache.view, in.q.data(), nt, nh, in.pos.data(), in.slot.data(), in.scale, ref.data(),
                c.softcap, c.window, sinks);
  const std::vector<double> mag(ref.size(), in.vmax);
  const auto isa = k == Kset::Avx512 ? detail::Isa::Avx512
                   : k == Kset::Avx2 ? detail::Isa::Avx2
                                     : detail::Isa::Scalar;
  for (int nth : c.threads) {
    ThreadPool pool(nth);
    const size_t ns = attention_scratch_floats(in.max_ctx, nth);
    std::vector<float> scratch(ns + 16, kGuard), out(ref.size() + 16, kGuard);
    const detail::AttentionArgs args{&in.cache.view, in.q.data(),    nt,       nh,
                                     in.pos.data(),  in.slot.data(), in.scale, out.data(),
                                     scratch.data(), c.softcap,      c.window, sinks};
    detail::attention_isa(isa, pool, args);
    const std::string what = std::string("attention threads=") + std::to_string(nth);
    expect_guard(out.data() + ref.size(), 16, what + " out");
    expect_guard(scratch.data() + ns, 16, what + " scratch");
    mismatches(c, what, out.data(), ref.data(), mag.data(), ref.size());
  }
}

// ---- the parameterised test

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> v = ultra::test::op_cases();
  return v;
}

struct Param {
  size_t index;  // into cases()
  Kset kset;
};

// Every (case, kernel set) pair where the set has a kernel for the op, a case's sets consecutive.
std::vector<Param> params() {
  std::vector<Param> p;
  for (size_t i = 0; i < cases().size(); ++i)
    for (Kset k : kKsets)
      if (has_kernel(cases()[i], k)) p.push_back({i, k});
  return p;
}

// gtest prints a failing test's parameter: the case and kernel set, not 16 bytes.
void PrintTo(const Param& p, std::ostream* os) {
  *os << case_name(cases()[p.index]) << " on " << kset_name(p.kset);
}

class BackendOps : public ::testing::TestWithParam<Param> {};

TEST_P(BackendOps, Run) {
  const OpCase& c = cases()[GetParam().index];
  const Kset k = GetParam().kset;
  const std::string why = unavailable(c, k);
  if (!why.empty()) GTEST_SKIP() << kset_name(k) << ": " << why;
  // Under the sanitizers (tests/sanitized.h) the scalar set's largest matmuls (513 rows of 4128 columns: 32
  // cases, 40% of the program's time there) run in the normal build only; the same row tails (513 x 768)
  // and block counts (33 x 4128) still run on that set.
  if (test::kSanitized && k == Kset::Scalar && c.op == Op::Matmul && c.rows >= 513 && c.cols >= 4128)
    GTEST_SKIP() << "sanitizer build: the scalar set's 513 x 4128 matmuls run in the normal build";
  switch (c.op) {
    case Op::Matmul:
      check_matmul(c, k == Kset::Vnni ? nullptr : &matmul_set(k), k == Kset::Vnni, true);
      break;
    case Op::RmsNorm:
      run_rmsnorm(c, k);
      break;
    case Op::SiluMul:
      run_silu(c, k);
      break;
    case Op::GeluMul:
      run_gelu(c, k);
      break;
    case Op::Softcap:
      run_softcap(c, k);
      break;
    case Op::F16Convert:
      run_f16(c, k);
      break;
    case Op::QuantizeQ8:
      run_quantize_q8(c, k);
      break;
    case Op::Rope:
      run_rope(c, k);
      break;
    case Op::Attention:
      run_attention(c, k);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return case_name(cases()[info.param.index]) + "_" + kset_name(info.param.kset);
                         });

// Which kernel sets this CPU runs (printed), and every op of the table has at least one set.
TEST(BackendOpsTable, KernelSetsOfThisCpu) {
  std::printf("[ kernels  ] active level %s; forced sets: avx2 %s, avx512 %s, vnni %s\n", kernel_isa(),
              detail::cpu_has_avx2() ? "runs" : "skipped (CPU lacks it)",
              detail::cpu_has_avx512() ? "runs" : "skipped (CPU lacks it)",
              detail::cpu_has_avx512_vnni() ? "runs" : "skipped (CPU lacks it)");
  for (Op op : {Op::Matmul, Op::RmsNorm, Op::Rope, Op::SiluMul, Op::GeluMul, Op::Softcap, Op::Attention,
                Op::QuantizeQ8, Op::F16Convert}) {
    int n = 0;
    for (const Param& p : params()) n += cases()[p.index].op == op;
    EXPECT_GT(n, 0) << "an op without cases or kernel sets: " << (int)op;
  }
  for (GgmlType t :
       {GgmlType::F32,     GgmlType::F16,     GgmlType::BF16,  GgmlType::Q8_0,    GgmlType::F8_E4M3,
        GgmlType::TERNARY, GgmlType::Q4_0,    GgmlType::Q4_1,  GgmlType::Q5_0,    GgmlType::Q5_1,
        GgmlType::Q2_K,    GgmlType::Q3_K,    GgmlType::Q4_K,  GgmlType::Q5_K,    GgmlType::Q6_K,
        GgmlType::IQ4_NL,  GgmlType::IQ4_XS,  GgmlType::MXFP4, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
        GgmlType::IQ2_S,   GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S,   GgmlType::IQ1_M}) {
    int n = 0;
    for (const OpCase& c : cases()) n += c.op == Op::Matmul && c.type == t;
    EXPECT_GT(n, 0) << "no matmul case for " << type_name(t);
  }
}

// The harness fails a wrong kernel: a set whose F32 and Q8_0 kernels drop the last column of every row (an
// off-by-one tail), on decode cases whose last column is a whole SIMD vector's tail.
detail::MatmulRangeFn g_f32_inner, g_q8_inner;
void f32_drop_last_column(const detail::MatmulArgs& a, int64_t r0, int64_t r1) {
  detail::MatmulArgs b = a;
  --b.cols;
  g_f32_inner(b, r0, r1);
}
void q8_drop_last_block(const detail::MatmulArgs& a, int64_t r0, int64_t r1) {
  detail::MatmulArgs b = a;
  b.cols -= 32;
  g_q8_inner(b, r0, r1);
}

TEST(BackendOpsTable, CatchesAWrongKernel) {
  for (Kset k : {Kset::Scalar, Kset::Avx2, Kset::Avx512}) {
    OpCase f32{Op::Matmul, GgmlType::F32, 33, 768, 1, {1, 3}, ultra::test::tol_matmul()};
    f32.seed = 7;
    if (!unavailable(f32, k).empty()) continue;
    detail::MatmulKernels broken = matmul_set(k);
    g_f32_inner = broken.f32;
    g_q8_inner = broken.q8_0;
    broken.f32 = f32_drop_last_column;
    broken.q8_0 = q8_drop_last_block;
    EXPECT_EQ(check_matmul(f32, &matmul_set(k), false, true), 0) << kset_name(k);
    EXPECT_GT(check_matmul(f32, &broken, false, false), 0) << kset_name(k) << ": a dropped column passed";
    OpCase q8 = f32;
    q8.type = GgmlType::Q8_0;
    q8.seed = 8;
    EXPECT_EQ(check_matmul(q8, &matmul_set(k), false, true), 0) << kset_name(k);
    EXPECT_GT(check_matmul(q8, &broken, false, false), 0) << kset_name(k) << ": a dropped Q8_0 block passed";
  }
}

}  // namespace
