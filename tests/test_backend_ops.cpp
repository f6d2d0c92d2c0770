// The backend op harness (llama.cpp's test-backend-ops): every case of tests/op_cases.h (op, type, shape,
// tolerance rule) against the op's scalar reference on every CPU kernel set with a kernel for it:
//   scalar  the scalar matmul kernel set and attention loop; rope and softcap (one f32 kernel at every
//           level); gelu_mul's scalar f32 body (only when the process runs scalar, ULTRA_NO_SIMD=1)
//   avx2    matmul_kernels_avx2(), attention_thread_avx2, rmsnorm/silu_mul/gelu_mul_avx2, the F16 row
//           conversions (the AVX-512 level runs these element-wise AVX2 bodies too)
//   avx512  matmul_kernels_avx512(), attention_thread_avx512
//   vnni    Q8_0 with int8 activations through matmul() (against quantize_x_q8_ref + matmul_q8_int8_ref)
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

using namespace ultra;
using namespace ultra::cpu;
using ultra::test::add_x_blocks;
using ultra::test::Cache;
using ultra::test::Data;
using ultra::test::kGuard;
using ultra::test::Mag;
using ultra::test::Op;
using ultra::test::OpCase;
using ultra::test::randn;
using ultra::test::Tol;
using ultra::test::weight_value;

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
             (c.tokens == 1 && detail::kquant_int8_vnni(c.type) != nullptr);
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

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = (char)std::tolower((unsigned char)ch);
  return r;
}

std::string num(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (char& ch : s)
    if (ch == '.') ch = 'p';
  return s;
}

// A gtest name for the case (letters, digits, underscores).
std::string case_name(const OpCase& c) {
  std::string n;
  switch (c.op) {
    case Op::Matmul:
      n = "matmul_" + lower(type_name(c.type)) + "_r" + std::to_string(c.rows) + "_c" +
          std::to_string(c.cols) + "_t" + std::to_string(c.tokens);
      if (c.group) n += c.group < 0 ? "_gtensor" : "_g" + std::to_string(c.group);
      if (c.data == Data::Q8WideScales) n += "_widescales";
      if (c.data == Data::XBlocks) n += "_xblocks";
      if (c.bias) n += "_bias";
      return n;
    case Op::RmsNorm:
      return "rmsnorm_r" + std::to_string(c.rows) + "_n" + std::to_string(c.cols);
    case Op::SiluMul:
      return "silu_mul_n" + std::to_string(c.cols);
    case Op::GeluMul:
      return "gelu_mul_n" + std::to_string(c.cols);
    case Op::Softcap:
      return "softcap_n" + std::to_string(c.cols) + "_cap" + num(c.param);
    case Op::F16Convert:
      return "f16_convert_n" + std::to_string(c.cols);
    case Op::QuantizeQ8:
      return "quantize_q8_n" + std::to_string(c.cols);
    case Op::Rope:
      return std::string("rope_") + (c.interleaved ? "interleaved" : "neox") + "_hd" +
             std::to_string(c.cols) + "_t" + std::to_string(c.tokens) + "_m" + num(c.param);
    case Op::Attention:
      return "attention_" + lower(type_name(c.type)) + "_h" + std::to_string(c.rows) + "_kv" +
             std::to_string(c.kv_heads) + "_hd" + std::to_string(c.cols) + "_t" + std::to_string(c.tokens) +
             "_ctx" + std::to_string(c.ctx) + "_w" + std::to_string(c.window) + "_cap" + num(c.softcap);
  }
  return "?";
}

// ---- comparison

// Elements of y outside the case's rule around ref (mag: the op's magnitudes, Mag); reports the first few
// (with what) when report is set. Exact cases compare bits (both NaN matches).
int mismatches(const OpCase& c, const std::string& what, const float* y, const float* ref, const double* mag,
               size_t n, bool report = true) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bool ok;
    double tol = 0;
    if (c.tol.exact()) {
      ok = std::memcmp(&y[i], &ref[i], 4) == 0 || (std::isnan(y[i]) && std::isnan(ref[i]));
    } else {
      tol = c.tol.rel * std::fabs((double)ref[i]) + c.tol.abs * (mag ? mag[i] : 1.0);
      ok = std::fabs((double)y[i] - ref[i]) <= tol;  // false for NaN
    }
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
  ultra::test::Weights wt;
  std::vector<double> wv;  // [rows, cols] the exact weight values, decoded here
  std::vector<float> x, bias;
  std::vector<float> ref;   // matmul_ref
  std::vector<double> mag;  // sqrt(cols) * (sum |w x| + |bias|)
};

void make_weights(const OpCase& c, MatmulData& d) {
  d.wt = ultra::test::make_weights(c.type, c.rows, c.cols, c.seed, c.group, c.data == Data::Q8WideScales);
  d.wv.resize(c.rows * c.cols);
  if (is_block_weight_type(c.type)) {  // whole rows at once (weight_value decodes a block per element)
    std::vector<float> row(c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
      dequantize(c.type, d.wt.bytes.data() + r * d.wt.view.row_bytes, c.cols, row.data());
      for (int64_t i = 0; i < c.cols; ++i) d.wv[r * c.cols + i] = row[i];
    }
    return;
  }
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.cols; ++i) d.wv[r * c.cols + i] = weight_value(d.wt.view, r, i);
}

// sqrt(cols) * (sum_c |w_rc x_tc| + |bias_r|) for x [nt, cols] (a quantised x for the int8 path).
std::vector<double> dot_magnitudes(const MatmulData& d, const float* x, int nt, const float* bias) {
  const int64_t rows = d.wt.view.rows, cols = d.wt.view.cols;
  std::vector<double> mag(rows * nt);
  for (int t = 0; t < nt; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = bias ? std::fabs(bias[r]) : 0.0;
      const double* wr = d.wv.data() + r * cols;
      const float* xt = x + t * cols;
      for (int64_t i = 0; i < cols; ++i) s += std::fabs(wr[i] * xt[i]);
      mag[t * rows + r] = std::sqrt((double)cols) * s;
    }
  return mag;
}

std::unique_ptr<MatmulData> prepare_matmul(const OpCase& c) {
  auto d = std::make_unique<MatmulData>();
  make_weights(c, *d);
  d->x = randn(c.tokens * c.cols, c.seed + 1);
  if (c.data == Data::XBlocks) add_x_blocks(d->x, c.cols);
  if (c.bias) d->bias = randn(c.rows, c.seed + 2);
  const float* b = c.bias ? d->bias.data() : nullptr;
  d->ref.resize(c.rows * c.tokens);
  matmul_ref(d->wt.view, d->x.data(), c.tokens, d->ref.data(), b);
  d->mag = dot_magnitudes(*d, d->x.data(), c.tokens, b);
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
  const float* b = c.bias ? d.bias.data() : nullptr;
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
      detail::quantize_x_q8_ref(d.x.data() + t * cols, cols, xq.data(), xd.data());
      detail::MatmulArgs a{
          d.wt.bytes.data(), d.wt.view.row_bytes, c.rows, cols, nullptr, 1, ref8.data() + t * c.rows, b};
      a.xq = xq.data();
      a.xd = xd.data();
      if (c.type == GgmlType::Q8_0)
        detail::matmul_q8_int8_ref(a, 0, c.rows);
      else
        detail::matmul_kquant_int8_ref(c.type, a, 0, c.rows);
      for (int64_t i = 0; i < cols; ++i) xdq[t * cols + i] = xq[i] * xd[i / 32];
    }
    mag8 = dot_magnitudes(d, xdq.data(), c.tokens, b);
    ref = &ref8;
    mag = &mag8;
  }
  MatmulMode mode(ks, int8 ? 1 : -1);
  int bad = 0;
  for (int nth : c.threads) {
    ThreadPool pool(nth);
    const std::string what = std::string(int8 ? "vnni" : ks->name) + " threads=" + std::to_string(nth);
    const auto y = run_matmul(pool, d.wt.view, d.x.data(), c.tokens, b, int8, what);
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

// Gates of scale sd with the exp's edge cases (0, +-large, the flush-to-zero threshold, tiny).
std::vector<float> gates(const OpCase& c, float sd) {
  auto g = randn(c.cols, c.seed, sd);
  const float special[] = {0.0f, -100.0f, 100.0f, -87.0f, 88.0f, -1e-8f, 30.0f, -1e6f, -20.0f, 1e4f, -1e4f};
  if (g.size() > 11) std::copy(std::begin(special), std::end(special), g.begin());
  return g;
}

void run_silu(const OpCase& c, Kset) {
  const int64_t n = c.cols;
  const auto g = gates(c, 6.0f), u = randn(n, c.seed + 1);
  std::vector<float> ref(n), y(n + 8, kGuard);
  silu_mul_ref(g.data(), u.data(), n, ref.data());
  detail::silu_mul_avx2(g.data(), u.data(), n, y.data());
  expect_guard(y.data() + n, 8, "silu_mul");
  mismatches(c, "silu_mul", y.data(), ref.data(), nullptr, n);
}

void run_gelu(const OpCase& c, Kset k) {
  const int64_t n = c.cols;
  const auto g = gates(c, 4.0f), u = randn(n, c.seed + 1);
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
  auto x = randn(n, c.seed, 1000.0f);
  const float special[] = {0.0f,    -0.0f, 65504.0f, 65520.0f,  -65519.0f, 1e-7f,      -6e-8f,
                           2.9e-8f, 1e5f,  INFINITY, -INFINITY, NAN,       6.1035e-5f, 3.0e-5f};
  for (size_t i = 0; i < std::size(special) && i < (size_t)n; ++i) x[i * 7 % n] = special[i];
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
  std::vector<int32_t> pos(nt);
  for (int t = 0; t < nt; ++t) pos[t] = t == 0 ? 0 : (t * 9973 + 3) % 40000;  // angles to 4e4 rad
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = (float)(1.0 / std::pow(10000.0, 2.0 * i / hd));
  const auto x = randn(nt * nh * hd, c.seed);
  std::vector<float> ref = x, y = x;
  rope_ref(ref.data(), nt, nh, hd, pos.data(), inv.data(), c.interleaved, c.param);
  rope(y.data(), nt, nh, hd, pos.data(), inv.data(), c.interleaved, c.param);
  std::vector<double> mag(x.size());
  for (size_t th = 0; th < (size_t)nt * nh; ++th)
    for (int i = 0; i < hd / 2; ++i) {
      const size_t i0 = th * hd + (c.interleaved ? 2 * i : i),
                   i1 = th * hd + (c.interleaved ? 2 * i + 1 : i + hd / 2);
      mag[i0] = mag[i1] = std::fabs(x[i0]) + std::fabs(x[i1]);
    }
  mismatches(c, "rope", y.data(), ref.data(), mag.data(), y.size());
}

// ---- attention

// Two slots with ctx positions of history each (written in prefill-like chunks of 64); this step's tokens
// split between them (the first half on slot 1), consecutive positions from ctx in each (query tiles).
void run_attention(const OpCase& c, Kset k) {
  const int n_kv = c.kv_heads, nh = (int)c.rows, hd = (int)c.cols, nt = c.tokens;
  const int max_ctx = c.ctx + nt + 3;
  Cache cache(c.type, 2, n_kv, max_ctx, hd);
  float vmax = 0;
  for (int s = 0; s < 2; ++s) {
    const auto hk = randn((size_t)c.ctx * n_kv * hd, c.seed + 10 + s),
               hv = randn((size_t)c.ctx * n_kv * hd, c.seed + 20 + s);
    for (float v : hv) vmax = std::max(vmax, std::fabs(v));
    for (int p0 = 0; p0 < c.ctx; p0 += 64) {
      const int n = std::min(64, c.ctx - p0);
      std::vector<int32_t> pos(n), slot(n, s);
      for (int i = 0; i < n; ++i) pos[i] = p0 + i;
      kv_write(cache.view, hk.data() + (size_t)p0 * n_kv * hd, hv.data() + (size_t)p0 * n_kv * hd, n,
               pos.data(), slot.data());
    }
  }
  std::vector<int32_t> pos(nt), slot(nt);
  const int first_half = (nt + 1) / 2;
  for (int t = 0; t < nt; ++t) {
    slot[t] = t < first_half ? 1 : 0;
    pos[t] = c.ctx + (t < first_half ? t : t - first_half);
  }
  const auto sk = randn((size_t)nt * n_kv * hd, c.seed + 30), sv = randn((size_t)nt * n_kv * hd, c.seed + 31);
  for (float v : sv) vmax = std::max(vmax, std::fabs(v));
  kv_write(cache.view, sk.data(), sv.data(), nt, pos.data(), slot.data());
  const auto q = randn((size_t)nt * nh * hd, c.seed + 32, 3.0f);
  const float scale = 1.0f / std::sqrt((float)hd);
  std::vector<float> ref((size_t)nt * nh * hd);
  attention_ref(cache.view, q.data(), nt, nh, pos.data(), slot.data(), scale, ref.data(), c.softcap,
                c.window);
  const std::vector<double> mag(ref.size(), vmax);
  const auto isa = k == Kset::Avx512 ? detail::Isa::Avx512
                   : k == Kset::Avx2 ? detail::Isa::Avx2
                                     : detail::Isa::Scalar;
  for (int nth : c.threads) {
    ThreadPool pool(nth);
    const size_t ns = attention_scratch_floats(max_ctx, nth);
    std::vector<float> scratch(ns + 16, kGuard), out(ref.size() + 16, kGuard);
    const detail::AttentionArgs args{&cache.view,    q.data(),    nt,      nh,
                                     pos.data(),     slot.data(), scale,   out.data(),
                                     scratch.data(), c.softcap,   c.window};
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
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::F8_E4M3,
                     GgmlType::TERNARY, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
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
