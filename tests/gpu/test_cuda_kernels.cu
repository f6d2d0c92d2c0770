// GPU test of src/backend/cuda: every kernel against an independent float64 reference written here (the
// project's convention for kernel oracles), on random data with odd shapes, outputs poisoned (NaN / 0xff)
// before each run so that an unwritten element fails. Prints one PASS/FAIL line per kernel and shape, then
// "test_cuda_kernels: N passed, M failed". Exit 0 when all pass, 1 on any failure, 77 when no CUDA device
// is present (ctest's skip code in this repo).
//
//   test_cuda_kernels [--out DIR] [--seed N] [--filter SUBSTRING] [--quick]
// --out DIR: also writes DIR/test_cuda_kernels.txt (the same lines). Nothing else is written.
//
// Depends only on the CUDA toolkit and header-only repo code (core/dtype.h conversions, sampling/philox.h),
// so it builds with nvcc alone (tools/gpu_suite.sh --nvcc).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/ternary.h"
#include "gpu_program.h"
#include "sampling/philox.h"

using namespace ultra;
using namespace ultra::cuda;
using namespace ultra::test;

namespace {

// ---- reporting

int g_pass = 0, g_fail = 0;
std::string g_filter;
bool g_quick = false;

bool enabled(const char* name) {
  return g_filter.empty() || std::string(name).find(g_filter) != std::string::npos;
}

void report(bool ok, const char* kernel, const std::string& shape, double err, double bound,
            const char* extra = "") {
  (ok ? g_pass : g_fail)++;
  say("%s %-14s %-64s err=%.3e bound=%.1e %s\n", ok ? "PASS" : "FAIL", kernel, shape.c_str(), err, bound,
      extra);
}

// gpu_program.h's CK: a failed CUDA call outside the kernels under test ends the program, after this line.
void summary_on_fatal() {
  ++g_fail;
  say("test_cuda_kernels: %d passed, %d failed\n", g_pass, g_fail);
}

std::string fmt(const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  char buf[512];
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

const char* tname(GgmlType t) {
  return t == GgmlType::F32 ? "f32" : t == GgmlType::F16 ? "f16" : t == GgmlType::BF16 ? "bf16" : "?";
}
size_t tsize(GgmlType t) {
  return t == GgmlType::F32 ? 4 : 2;
}

// ---- device memory

// ---- data

std::mt19937_64 g_rng;

std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}
std::vector<float> randu(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}
int randi(int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(g_rng);
}

// Element storage of type t for the values v (rounded); dec receives the decoded values (exact).
std::vector<uint8_t> encode(GgmlType t, const std::vector<float>& v, std::vector<double>* dec) {
  std::vector<uint8_t> b(v.size() * tsize(t));
  if (dec) dec->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    double d;
    if (t == GgmlType::F32) {
      std::memcpy(&b[4 * i], &v[i], 4);
      d = v[i];
    } else {
      const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(&b[2 * i], &h, 2);
      d = t == GgmlType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    if (dec) (*dec)[i] = d;
  }
  return b;
}

// ||a - ref|| / ||ref|| over all elements; NaN if any a is not finite. ref all zero: max |a|.
// float64 reference: y[t, r] = sum_c w[r * cols + c] x[t, c] (+ bias[r]) (+ y0[t, r]), t < n.
template <class W>
std::vector<double> ref_matmul(const W& w, const std::vector<float>& x, int n, int64_t rows, int64_t cols,
                               const float* bias, const float* y0) {
  std::vector<double> ref((size_t)n * rows);
  for (int tk = 0; tk < n; ++tk)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += (double)w[r * cols + c] * x[(size_t)tk * cols + c];
      ref[(size_t)tk * rows + r] = s + (bias ? bias[r] : 0.0) + (y0 ? y0[(size_t)tk * rows + r] : 0.0);
    }
  return ref;
}

double rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return NAN;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool ok_err(double e, double bound) {
  return e <= bound;  // false for NaN
}

DeviceInfo g_dev;

// =====================================================================================================
// embed, rmsnorm, silu_mul, add, gather_rows, convert

void test_embed(GgmlType t, int vocab, int dim, int n) {
  std::vector<double> dec;
  auto tab = encode(t, randn((size_t)vocab * dim), &dec);
  std::vector<int32_t> tok(n);
  for (int i = 0; i < n; ++i) tok[i] = randi(0, vocab - 1);
  if (n > 2) tok[1] = vocab + 5, tok[2] = -3;  // out of range: zero rows
  DevBuf<uint8_t> dt(tab.size());
  dt.put(tab);
  DevBuf<int32_t> dk(n);
  dk.put(tok);
  DevBuf<float> dx((size_t)n * dim);
  dx.poison();
  WeightView w{t, dt.get(), vocab, dim, (size_t)dim * tsize(t)};
  CK(embed(w, dk.get(), n, dx.get(), 0));
  CK(cudaDeviceSynchronize());
  std::vector<double> ref((size_t)n * dim, 0.0);
  for (int i = 0; i < n; ++i)
    if (tok[i] >= 0 && tok[i] < vocab)
      for (int d = 0; d < dim; ++d) ref[(size_t)i * dim + d] = dec[(size_t)tok[i] * dim + d];
  const double e = rel_err(dx.all(), ref);
  report(ok_err(e, 0.0), "embed", fmt("%s vocab=%d dim=%d n=%d", tname(t), vocab, dim, n), e, 0.0);
}

void test_rmsnorm(int n, int dim) {
  auto x = randn((size_t)n * dim, 3.0f), w = randu(dim, 0.5f, 1.5f);
  const float eps = 1e-5f;
  DevBuf<float> dx(x.size()), dw(dim), dout(x.size());
  dx.put(x);
  dw.put(w);
  dout.poison();
  CK(rmsnorm(dx.get(), dw.get(), n, dim, eps, dout.get(), 0));
  CK(cudaDeviceSynchronize());
  std::vector<double> ref(x.size());
  for (int r = 0; r < n; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += (double)x[(size_t)r * dim + i] * x[(size_t)r * dim + i];
    const double sc = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) ref[(size_t)r * dim + i] = x[(size_t)r * dim + i] * sc * w[i];
  }
  const double e = rel_err(dout.all(), ref);
  report(ok_err(e, 2e-6), "rmsnorm", fmt("n=%d dim=%d", n, dim), e, 2e-6);
}

void test_elementwise(int64_t count, int offset) {
  // offset shifts the pointers off 16-byte alignment (scalar paths)
  auto g = randn(count + offset, 4.0f), u = randn(count + offset), y = randn(count + offset);
  DevBuf<float> dg(g.size()), du(u.size()), dy(y.size()), dout(count + offset);
  dg.put(g);
  du.put(u);
  dy.put(y);
  dout.poison();
  CK(silu_mul(dg.get() + offset, du.get() + offset, count, dout.get() + offset, 0));
  CK(cudaDeviceSynchronize());
  std::vector<double> ref(count);
  for (int64_t i = 0; i < count; ++i) {
    const double gg = g[i + offset];
    ref[i] = gg / (1.0 + std::exp(-gg)) * u[i + offset];
  }
  auto o = dout.all();
  std::vector<float> o2(o.begin() + offset, o.end());
  double e = rel_err(o2, ref);
  report(ok_err(e, 2e-6), "silu_mul", fmt("count=%lld offset=%d", (long long)count, offset), e, 2e-6);

  CK(add(dg.get() + offset, dy.get() + offset, count, 0));
  CK(cudaDeviceSynchronize());
  auto a = dg.all();
  for (int64_t i = 0; i < count; ++i)
    ref[i] = (double)(g[i + offset] + y[i + offset]);  // f32 add: exact match
  std::vector<float> a2(a.begin() + offset, a.end());
  e = rel_err(a2, ref);
  report(ok_err(e, 0.0), "add", fmt("count=%lld offset=%d", (long long)count, offset), e, 0.0);

  // Gemma's ops against float64: tanh-GELU gating, scaling, soft-capping (tanhf and a few f32 roundings).
  dg.put(g);
  dout.poison();
  CK(gelu_mul(dg.get() + offset, du.get() + offset, count, dout.get() + offset, 0));
  CK(cudaDeviceSynchronize());
  for (int64_t i = 0; i < count; ++i) {
    const double x = g[i + offset];
    ref[i] = 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))) * u[i + offset];
  }
  o = dout.all();
  o2.assign(o.begin() + offset, o.end());
  // Relative to the size of the terms, |x u|: for x << 0, 1 + tanh(.) cancels (tanhf's last bit becomes a
  // 1e-4 relative error of the product), which a relative error of a few negative elements would show.
  {
    double num = 0, den = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(o2[i])) num = NAN;
      const double d = o2[i] - ref[i], s = (double)g[i + offset] * u[i + offset];
      num += d * d;
      den += s * s;
    }
    e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }
  report(ok_err(e, 2e-6), "gelu_mul",
         fmt("count=%lld offset=%d (error relative to |x u|)", (long long)count, offset), e, 2e-6);
  for (float cap : {30.0f, 0.5f}) {
    dg.put(g);
    CK(softcap(dg.get() + offset, count, cap, 0));
    CK(scale(dg.get() + offset, count, 3.0f, 0));
    CK(cudaDeviceSynchronize());
    for (int64_t i = 0; i < count; ++i) ref[i] = 3.0 * cap * std::tanh((double)g[i + offset] / cap);
    a = dg.all();
    a2.assign(a.begin() + offset, a.end());
    e = rel_err(a2, ref);
    report(ok_err(e, 2e-6), "softcap + scale",
           fmt("count=%lld offset=%d cap=%g", (long long)count, offset, cap), e, 2e-6);
  }
}

void test_gather(int n_src, int n_out, int dim) {
  auto x = randn((size_t)n_src * dim);
  std::vector<int32_t> rows(n_out);
  for (auto& r : rows) r = randi(0, n_src - 1);
  if (n_out > 1) rows[n_out - 1] = -1;
  DevBuf<float> dx(x.size()), dout((size_t)n_out * dim);
  DevBuf<int32_t> dr(n_out);
  dx.put(x);
  dr.put(rows);
  dout.poison();
  CK(gather_rows(dx.get(), dr.get(), n_out, dim, dout.get(), 0));
  CK(cudaDeviceSynchronize());
  std::vector<double> ref((size_t)n_out * dim, 0.0);
  for (int r = 0; r < n_out; ++r)
    if (rows[r] >= 0)
      for (int d = 0; d < dim; ++d) ref[(size_t)r * dim + d] = x[(size_t)rows[r] * dim + d];
  const double e = rel_err(dout.all(), ref);
  report(ok_err(e, 0.0), "gather_rows", fmt("n_src=%d n_out=%d dim=%d", n_src, n_out, dim), e, 0.0);
}

void test_convert(GgmlType t, int64_t count) {
  auto x = randn(count, 10.0f);
  DevBuf<float> dx(count);
  DevBuf<uint16_t> dout(count);
  dx.put(x);
  dout.poison();
  CK(convert_f32(dx.get(), count, t, dout.get(), 0));
  CK(cudaDeviceSynchronize());
  auto o = dout.all();
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t want = t == GgmlType::F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
    bad += o[i] != want;
  }
  report(bad == 0, "convert_f32",
         fmt("%s count=%lld (bit-exact vs core/dtype.h)", tname(t), (long long)count), (double)bad, 0.0);
}

// =====================================================================================================
// rope, kv_write

void test_rope(int n, int n_heads, int n_kv, int hd, bool interleaved, bool with_k) {
  auto q = randn((size_t)n * n_heads * hd), k = randn((size_t)n * n_kv * hd);
  std::vector<int32_t> pos(n);
  for (auto& p : pos) p = randi(0, 32767);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, (float)(2 * i) / (float)hd);
  DevBuf<float> dq(q.size()), dk(k.size()), di(inv.size());
  DevBuf<int32_t> dp(n);
  dq.put(q);
  dk.put(k);
  di.put(inv);
  dp.put(pos);
  CK(rope(dq.get(), n_heads, with_k ? dk.get() : nullptr, n_kv, n, hd, dp.get(), di.get(), interleaved, 0));
  CK(cudaDeviceSynchronize());
  auto ref_rot = [&](const std::vector<float>& x, int heads) {  // rope_ref's arithmetic
    std::vector<double> r(x.begin(), x.end());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const float theta = (float)pos[t] * inv[i];
          const double c = std::cos((double)theta), s = std::sin((double)theta);
          const size_t b = ((size_t)t * heads + h) * hd;
          const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + hd / 2;
          const double x0 = x[b + i0], x1 = x[b + i1];
          r[b + i0] = x0 * c - x1 * s;
          r[b + i1] = x0 * s + x1 * c;
        }
    return r;
  };
  double e = rel_err(dq.all(), ref_rot(q, n_heads));
  if (with_k) e = std::max(e, rel_err(dk.all(), ref_rot(k, n_kv)));
  report(ok_err(e, 1e-6), "rope",
         fmt("n=%d heads=%d kv=%d hd=%d %s%s", n, n_heads, n_kv, hd,
             interleaved ? "interleaved" : "rotate-half", with_k ? " q+k" : " q"),
         e, 1e-6);
}

void test_kv_write(GgmlType t, int n, int n_slots, int n_kv, int max_ctx, int hd) {
  const size_t cache_elems = (size_t)n_slots * n_kv * max_ctx * hd;
  DevBuf<uint8_t> ck(cache_elems * tsize(t)), cv(cache_elems * tsize(t));
  ck.poison();
  cv.poison();
  auto k = randn((size_t)n * n_kv * hd), v = randn((size_t)n * n_kv * hd);
  std::vector<int32_t> pos(n), seq(n);
  std::vector<std::pair<int, int>> used;
  for (int i = 0; i < n; ++i) {  // distinct (seq, pos) pairs, some padding / out-of-range rows
    int s, p;
    do {
      s = randi(0, n_slots - 1);
      p = randi(0, max_ctx - 1);
    } while (std::find(used.begin(), used.end(), std::make_pair(s, p)) != used.end());
    used.push_back({s, p});
    seq[i] = s, pos[i] = p;
  }
  if (n > 2) seq[1] = -1;           // padding
  if (n > 3) pos[2] = max_ctx + 3;  // out of range: skipped
  DevBuf<float> dk(k.size()), dv(v.size());
  DevBuf<int32_t> dp(n), ds(n);
  dk.put(k);
  dv.put(v);
  dp.put(pos);
  ds.put(seq);
  KvLayerView kv{t, ck.get(), cv.get(), n_slots, n_kv, max_ctx, hd};
  CK(kv_write(kv, dk.get(), dv.get(), n, dp.get(), ds.get(), 0));
  CK(cudaDeviceSynchronize());
  auto hk = ck.all(), hv = cv.all();
  const size_t es = tsize(t);
  std::vector<uint8_t> expect_k(cache_elems * es, 0xff), expect_v(cache_elems * es, 0xff);
  for (int i = 0; i < n; ++i) {
    if (seq[i] < 0 || seq[i] >= n_slots || pos[i] < 0 || pos[i] >= max_ctx) continue;
    for (int h = 0; h < n_kv; ++h) {
      std::vector<float> kr(k.begin() + ((size_t)i * n_kv + h) * hd,
                            k.begin() + ((size_t)i * n_kv + h + 1) * hd);
      std::vector<float> vr(v.begin() + ((size_t)i * n_kv + h) * hd,
                            v.begin() + ((size_t)i * n_kv + h + 1) * hd);
      auto kb = encode(t, kr, nullptr), vb = encode(t, vr, nullptr);
      const size_t dst = ((((size_t)seq[i] * n_kv + h) * max_ctx) + pos[i]) * hd * es;
      std::memcpy(&expect_k[dst], kb.data(), kb.size());
      std::memcpy(&expect_v[dst], vb.data(), vb.size());
    }
  }
  size_t bad = 0;
  for (size_t i = 0; i < hk.size(); ++i) bad += (hk[i] != expect_k[i]) + (hv[i] != expect_v[i]);
  report(bad == 0, "kv_write",
         fmt("%s n=%d slots=%d kv=%d ctx=%d hd=%d (bit-exact, untouched bytes kept)", tname(t), n, n_slots,
             n_kv, max_ctx, hd),
         (double)bad, 0.0);
}

// rope_kv_write against rope + kv_write on the same inputs: q, k and both caches bit-identical.
void test_rope_kv(GgmlType t, int n, int n_heads, int n_kv, int hd, bool interleaved) {
  const int n_slots = 3, max_ctx = 300;
  auto q = randn((size_t)n * n_heads * hd), k = randn((size_t)n * n_kv * hd),
       v = randn((size_t)n * n_kv * hd);
  std::vector<int32_t> pos(n), seq(n);
  for (int i = 0; i < n; ++i) pos[i] = (i * 37) % max_ctx, seq[i] = i % n_slots;
  if (n > 2) seq[1] = -1;           // padding: rotated, not stored
  if (n > 3) pos[2] = max_ctx + 5;  // out of range: rotated, not stored
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, (float)(2 * i) / (float)hd);
  const size_t ce = (size_t)n_slots * n_kv * max_ctx * hd * tsize(t);
  DevBuf<float> q1(q.size()), k1(k.size()), q2(q.size()), k2(k.size()), dv(v.size()), di(inv.size());
  DevBuf<int32_t> dp(n), ds(n);
  DevBuf<uint8_t> ck1(ce), cv1(ce), ck2(ce), cv2(ce);
  for (auto* c : {&ck1, &cv1, &ck2, &cv2}) c->poison();
  q1.put(q), k1.put(k), q2.put(q), k2.put(k), dv.put(v), di.put(inv), dp.put(pos), ds.put(seq);
  KvLayerView kv1{t, ck1.get(), cv1.get(), n_slots, n_kv, max_ctx, hd},
      kv2{t, ck2.get(), cv2.get(), n_slots, n_kv, max_ctx, hd};
  CK(rope(q1.get(), n_heads, k1.get(), n_kv, n, hd, dp.get(), di.get(), interleaved, 0));
  CK(kv_write(kv1, k1.get(), dv.get(), n, dp.get(), ds.get(), 0));
  CK(rope_kv_write(q2.get(), n_heads, k2.get(), dv.get(), kv2, n, dp.get(), ds.get(), di.get(), interleaved,
                   0));
  CK(cudaDeviceSynchronize());
  const bool same =
      q1.all() == q2.all() && k1.all() == k2.all() && ck1.all() == ck2.all() && cv1.all() == cv2.all();
  report(same, "rope_kv_write",
         fmt("%s n=%d heads=%d kv=%d hd=%d %s == rope + kv_write (bit-exact)", tname(t), n, n_heads, n_kv, hd,
             interleaved ? "interleaved" : "rotate-half"),
         same ? 0 : 1, 0);
}

// =====================================================================================================
// matmul

void test_gemv(GgmlType t, int64_t rows, int64_t cols, int n, bool bias, bool acc, GemvPath path,
               int pad_bytes = 0) {
  std::vector<double> wd;
  auto wf = randu((size_t)rows * cols, -1.0f, 1.0f);
  auto wb = encode(t, wf, &wd);
  const size_t es = tsize(t), rb = cols * es + pad_bytes;
  std::vector<uint8_t> wpad(rows * rb, 0);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&wpad[r * rb], &wb[r * cols * es], cols * es);
  auto x = randn((size_t)n * cols), b = randn(rows), y0 = randn((size_t)n * rows);
  DevBuf<uint8_t> dw(wpad.size());
  DevBuf<float> dx(x.size()), db(rows), dy(y0.size());
  dw.put(wpad);
  dx.put(x);
  db.put(b);
  if (acc)
    dy.put(y0);
  else
    dy.poison();
  WeightView w{t, dw.get(), rows, cols, rb};
  const cudaError_t e0 = gemv(w, dx.get(), n, dy.get(), bias ? db.get() : nullptr, acc, 0, path);
  const char* pname = path == GemvPath::simt ? "simt" : path == GemvPath::tensor_core ? "tc" : "auto";
  const std::string shape =
      fmt("%s rows=%lld cols=%lld n=%d%s%s%s %s", tname(t), (long long)rows, (long long)cols, n,
          bias ? " bias" : "", acc ? " acc" : "", pad_bytes ? " padded" : "", pname);
  if (e0 != cudaSuccess) {
    report(false, "gemv", shape, NAN, 0, cudaGetErrorString(e0));
    return;
  }
  CK(cudaDeviceSynchronize());
  const auto ref = ref_matmul(wd, x, n, rows, cols, bias ? b.data() : nullptr, acc ? y0.data() : nullptr);
  const double e = rel_err(dy.all(), ref);
  report(ok_err(e, 1e-5), "gemv", shape, e, 1e-5);
}

// The one-row ops fused into the streaming gemv's x (gemv_rmsnorm, gemv_swiglu) against float64 and
// bit-identical to the ops one by one (gather_rows + rmsnorm + gemv; silu_mul + gemv), which is what lets
// the decode step use them with unchanged results. `row`: the gathered row of a 3-row x (-1: a zero row,
// -2: no row pointer, row 0).
// w: the device view (rows x cols), wd its weights as float64; tn: the type's name in the report.
void check_gemv_fused_input(const WeightView& w, const std::vector<double>& wd, const char* tn, bool swiglu,
                            int row, bool bias, bool acc) {
  const int64_t rows = w.rows, cols = w.cols;
  const int nx = 3;
  auto x = randn((size_t)nx * cols), u = randn(cols), nw = randu(cols, 0.5f, 1.5f), b = randn(rows),
       y0 = randn(rows);
  for (auto& v : x) v *= swiglu ? 3.0f : 7.0f;
  DevBuf<float> dx(x.size()), du(cols), dnw(cols), db(rows), dy(rows), dy2(rows), dh(cols), dg(cols);
  DevBuf<int32_t> dr(1);
  dx.put(x), du.put(u), dnw.put(nw), db.put(b);
  dr.put(std::vector<int32_t>{row});
  if (acc)
    dy.put(y0), dy2.put(y0);
  else
    dy.poison(), dy2.poison();
  const float eps = 1e-5f;
  const std::string shape =
      fmt("%s rows=%lld cols=%lld%s%s%s", tn, (long long)rows, (long long)cols,
          swiglu ? "" : fmt(" row=%d", row).c_str(), bias ? " bias" : "", acc ? " acc" : "");
  const char* name = swiglu ? "gemv_swiglu" : "gemv_rmsnorm";
  const float* bp = swiglu ? nullptr : (bias ? db.get() : nullptr);
  const cudaError_t e0 = swiglu ? gemv_swiglu(w, dx.get(), du.get(), dy.get(), acc, 0)
                                : gemv_rmsnorm(w, dx.get(), row == -2 ? nullptr : dr.get(), dnw.get(), eps,
                                               dy.get(), bp, acc, 0);
  if (e0 != cudaSuccess) {
    report(false, name, shape, NAN, 0, cudaGetErrorString(e0));
    return;
  }
  if (swiglu) {
    CK(silu_mul(dx.get(), du.get(), cols, dh.get(), 0));
  } else {
    if (row == -2)
      dg.put(std::vector<float>(x.begin(), x.begin() + cols));
    else
      CK(gather_rows(dx.get(), dr.get(), 1, (int)cols, dg.get(), 0));
    CK(rmsnorm(dg.get(), dnw.get(), 1, (int)cols, eps, dh.get(), 0));
  }
  CK(gemv(w, dh.get(), 1, dy2.get(), bp, acc, 0));
  CK(cudaDeviceSynchronize());
  // float64: the input row, its transform, the products.
  std::vector<double> h(cols);
  const int src = row == -2 ? 0 : row;
  if (swiglu) {
    for (int64_t c = 0; c < cols; ++c) h[c] = x[c] / (1.0 + std::exp(-(double)x[c])) * u[c];
  } else {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double v = src < 0 ? 0.0 : x[(size_t)src * cols + c];
      ss += v * v;
    }
    const double sc = 1.0 / std::sqrt(ss / (double)cols + eps);
    for (int64_t c = 0; c < cols; ++c) h[c] = (src < 0 ? 0.0 : x[(size_t)src * cols + c]) * sc * nw[c];
  }
  std::vector<double> ref(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = acc ? y0[r] : 0.0;
    if (bp) sum += b[r];
    for (int64_t c = 0; c < cols; ++c) sum += wd[r * cols + c] * h[c];
    ref[r] = sum;
  }
  const auto got = dy.all();
  const double e = rel_err(got, ref);
  const bool same = got == dy2.all();
  report(ok_err(e, 1e-5) && same, name,
         shape + (swiglu ? " (== silu_mul + gemv bit-exact)" : " (== gather + rmsnorm + gemv bit-exact)"), e,
         1e-5, same ? "" : "differs from the ops one by one");
}

void test_gemv_fused_input(GgmlType t, int64_t rows, int64_t cols, bool swiglu, int row, bool bias,
                           bool acc) {
  std::vector<double> wd;
  auto wb = encode(t, randu((size_t)rows * cols, -1.0f, 1.0f), &wd);
  DevBuf<uint8_t> dw(wb.size());
  dw.put(wb);
  check_gemv_fused_input({t, dw.get(), rows, cols, (size_t)cols * tsize(t)}, wd, tname(t), swiglu, row, bias,
                         acc);
}

// Prefill GEMM through cuBLASLt: x is rounded to the weight type, so the error is that rounding: for BF16
// each x has relative error <= 2^-9 (~2^-9 / sqrt(3) ~ 1.1e-3 rms), F16 2^-11; random-sign errors add in
// quadrature, so ||err|| / ||ref|| stays near those values. Bounds 1e-2 (BF16) and 3e-3 (F16) leave margin;
// a layout or transposition error gives O(1). F32 weights use an f32 GEMM: 1e-5.
void test_matmul(CudaMatmul& mm, GgmlType t, int64_t rows, int64_t cols, int n, bool bias, bool acc) {
  std::vector<double> wd;
  auto wb = encode(t, randu((size_t)rows * cols, -1.0f, 1.0f), &wd);
  auto x = randn((size_t)n * cols), b = randn(rows), y0 = randn((size_t)n * rows);
  DevBuf<uint8_t> dw(wb.size());
  DevBuf<float> dx(x.size()), db(rows), dy(y0.size());
  dw.put(wb);
  dx.put(x);
  db.put(b);
  if (acc)
    dy.put(y0);
  else
    dy.poison();
  WeightView w{t, dw.get(), rows, cols, (size_t)cols * tsize(t)};
  const std::string shape = fmt("%s rows=%lld cols=%lld n=%d%s%s", tname(t), (long long)rows, (long long)cols,
                                n, bias ? " bias" : "", acc ? " acc" : "");
  const cudaError_t e0 = mm.matmul(w, dx.get(), n, dy.get(), bias ? db.get() : nullptr, acc, 0);
  if (e0 != cudaSuccess) {
    report(false, "matmul", shape, NAN, 0,
           fmt("%s (cublas status %d)", cudaGetErrorString(e0), mm.last_cublas_status()).c_str());
    return;
  }
  CK(cudaDeviceSynchronize());
  const auto ref = ref_matmul(wd, x, n, rows, cols, bias ? b.data() : nullptr, acc ? y0.data() : nullptr);
  const double bound = t == GgmlType::BF16 ? 1e-2 : t == GgmlType::F16 ? 3e-3 : 1e-5;
  const double e = rel_err(dy.all(), ref);
  report(ok_err(e, bound), "matmul", shape, e, bound, n > kGemvMaxRows ? "(cuBLASLt)" : "(gemv)");
}

// =====================================================================================================
// low-bit weights (Q8_0, F8_E4M3, TERNARY): gemv, the prefill matmul and embed on the device layout

// Scale layouts of the F8_E4M3 / TERNARY test matrices: one per tensor, per row, or per row and group of
// `group` columns (FP8: 128 as HF block-wise checkpoints, the last group partial, or an odd 40 that 16-column
// groups straddle; ternary: 256 as repacked TQ1_0 / TQ2_0, or 16).
struct LowbitCase {
  GgmlType t;
  int64_t rows, cols;
  int64_t group = 0;  // 0: per row (scale_group = cols)
  bool per_tensor = false;
};

const char* lbname(GgmlType t) {
  return t == GgmlType::Q8_0 ? "q8_0" : t == GgmlType::F8_E4M3 ? "fp8" : "ternary";
}

std::string lbshape(const LowbitCase& c) {
  return fmt("%s rows=%lld cols=%lld %s", lbname(c.t), (long long)c.rows, (long long)c.cols,
             c.per_tensor ? "scale/tensor"
             : c.group    ? fmt("scale/%lld cols", (long long)c.group).c_str()
                          : "scale/row");
}

// A random matrix in the host (GGUF) layout, its scales, and its f32 weights (decode * scale, the product
// rounded to f32 as the CPU's dequant_row) in wf; uploaded in the device layout (lowbit_pack_rows).
struct LowbitMatrix {
  std::vector<uint8_t> host;  // [rows, host row bytes]
  std::vector<float> scale;   // F8_E4M3 / TERNARY
  std::vector<float> wf;      // [rows, cols]
  DevBuf<uint8_t> dw;
  DevBuf<float> ds;
  WeightView host_view, dev_view;

  explicit LowbitMatrix(const LowbitCase& c) {
    const int64_t R = c.rows, C = c.cols;
    wf.resize((size_t)(R * C));
    WeightView w;
    w.type = c.t;
    w.rows = R;
    w.cols = C;
    if (c.t == GgmlType::Q8_0) {
      w.row_bytes = (size_t)(C / kQ8_0Block) * sizeof(BlockQ8_0);
      host.resize(w.row_bytes * R);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t b = 0; b < C / kQ8_0Block; ++b) {
          BlockQ8_0 blk;
          blk.d = fp32_to_fp16(randu(1, 1e-3f, 2e-2f)[0]);
          for (int i = 0; i < kQ8_0Block; ++i) blk.qs[i] = (int8_t)randi(-128, 127);
          std::memcpy(&host[r * w.row_bytes + b * sizeof blk], &blk, sizeof blk);
          for (int i = 0; i < kQ8_0Block; ++i)
            wf[r * C + b * kQ8_0Block + i] = fp16_to_fp32(blk.d) * (float)blk.qs[i];
        }
    } else {
      const int64_t G = c.group ? c.group : C, gpr = (C + G - 1) / G;
      w.scale_group = G;
      w.scale_row_stride = c.per_tensor ? 0 : gpr;
      scale = randu(c.per_tensor ? 1 : (size_t)(R * gpr), 0.01f, 0.1f);
      auto sc = [&](int64_t r, int64_t col) { return scale[r * w.scale_row_stride + col / G]; };
      if (c.t == GgmlType::F8_E4M3) {
        w.row_bytes = (size_t)C;
        host.resize(w.row_bytes * R);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t col = 0; col < C; ++col) {
            uint8_t code;
            do code = (uint8_t)randi(0, 255);
            while (fp8_e4m3_is_nan(code));  // every other code, subnormals and zeros included
            host[r * C + col] = code;
            wf[r * C + col] = fp8_e4m3_to_fp32(code) * sc(r, col);
          }
      } else {
        w.row_bytes = (size_t)(C / 4);
        host.resize(w.row_bytes * R);
        std::vector<int8_t> t((size_t)C);
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t col = 0; col < C; ++col) t[col] = (int8_t)randi(-1, 1);
          ternary_pack(t.data(), C, reinterpret_cast<uint32_t*>(&host[r * w.row_bytes]));
          for (int64_t col = 0; col < C; ++col) wf[r * C + col] = (float)t[col] * sc(r, col);
        }
      }
    }
    w.data = host.data();
    w.scale = scale.empty() ? nullptr : scale.data();
    host_view = w;
    const size_t rb = lowbit_row_bytes(c.t, C);
    std::vector<uint8_t> packed(rb * R);
    if (!lowbit_pack_rows(w, 0, R, packed.data())) {
      say("FAIL lowbit_pack  %s\n", lbshape(c).c_str());
      ++g_fail;
    }
    dw.alloc(packed.size());
    dw.put(packed);
    dev_view = w;
    dev_view.data = dw.get();
    dev_view.row_bytes = rb;
    if (!scale.empty()) {
      ds.alloc(scale.size());
      ds.put(scale);
      dev_view.scale = ds.get();
    }
  }
};

// gemv (n <= 32) or the CudaMatmul entry (mm non-null: n > 32 dequantises to BF16 for cuBLASLt) against
// float64 sums of the f32 weights. gemv: f32 products and sums, bound 1e-5 as the dense gemv; the prefill
// GEMM rounds weights and x to BF16 (each 2^-9 relative at most, ~1.1e-3 rms each): bound 1e-2.
// bulk >= 0: gemv_lowbit_tc with that many bulk-copy slots (0: its register loads) instead of gemv().
// bound > 0: that bound instead of the path's own.
void test_lowbit_mm(const LowbitCase& c, int n, bool bias, bool acc, CudaMatmul* mm, float x_mul = 1.0f,
                    int bulk = -1, double bound_override = 0.0) {
  LowbitMatrix m(c);
  const int64_t R = c.rows, C = c.cols;
  auto x = randn((size_t)n * C), b = randn(R), y0 = randn((size_t)n * R);
  for (float& v : x) v *= x_mul;
  for (float& v : b) v *= x_mul;
  for (float& v : y0) v *= x_mul;
  DevBuf<float> dx(x.size()), db(R), dy(y0.size());
  dx.put(x);
  db.put(b);
  if (acc)
    dy.put(y0);
  else
    dy.poison();
  const std::string shape = lbshape(c) + fmt(" n=%d%s%s", n, bias ? " bias" : "", acc ? " acc" : "") +
                            (x_mul != 1.0f ? fmt(" x*%g", x_mul) : std::string()) +
                            (bulk >= 0 ? fmt(" slots=%d", bulk) : std::string());
  const cudaError_t e0 =
      mm          ? mm->matmul(m.dev_view, dx.get(), n, dy.get(), bias ? db.get() : nullptr, acc, 0)
      : bulk >= 0 ? gemv_lowbit_tc(m.dev_view, dx.get(), n, dy.get(), bias ? db.get() : nullptr, acc, 0, bulk)
                  : gemv(m.dev_view, dx.get(), n, dy.get(), bias ? db.get() : nullptr, acc, 0);
  const char* kname = mm ? "lowbit_matmul" : bulk >= 0 ? "lowbit_tc" : "lowbit_gemv";
  if (e0 != cudaSuccess) {
    const std::string why = std::string(cudaGetErrorString(e0)) +
                            (mm ? fmt(" (cublas status %d)", mm->last_cublas_status()) : std::string());
    report(false, kname, shape, NAN, 0, why.c_str());
    return;
  }
  CK(cudaDeviceSynchronize());
  const auto ref = ref_matmul(m.wf, x, n, R, C, bias ? b.data() : nullptr, acc ? y0.data() : nullptr);
  // Through CudaMatmul, steps of more than kLowbitGemvMaxRows rows use a BF16 copy of the weights.
  const double bound = bound_override > 0.0 ? bound_override : mm && n > kLowbitGemvMaxRows ? 1e-2 : 1e-5;
  const double e = rel_err(dy.all(), ref);
  report(ok_err(e, bound), kname, shape, e, bound);
}

// embed: rows of the f32 weights, bit for bit.
void test_lowbit_embed(const LowbitCase& c, int n) {
  LowbitMatrix m(c);
  std::vector<int32_t> tok(n);
  for (int i = 0; i < n; ++i) tok[i] = randi(0, (int)c.rows - 1);
  if (n > 2) tok[1] = (int)c.rows + 5, tok[2] = -3;  // out of range: zero rows
  DevBuf<int32_t> dk(n);
  dk.put(tok);
  DevBuf<float> dx((size_t)n * c.cols);
  dx.poison();
  CK(embed(m.dev_view, dk.get(), n, dx.get(), 0));
  CK(cudaDeviceSynchronize());
  std::vector<double> ref((size_t)n * c.cols, 0.0);
  for (int i = 0; i < n; ++i)
    if (tok[i] >= 0 && tok[i] < c.rows)
      for (int64_t d = 0; d < c.cols; ++d) ref[(size_t)i * c.cols + d] = m.wf[tok[i] * c.cols + d];
  const double e = rel_err(dx.all(), ref);
  report(ok_err(e, 0.0), "lowbit_embed", lbshape(c) + fmt(" n=%d", n), e, 0.0);
}

// F8_E4M3 with a scale per row (or tensor) through the streaming kernel's fused inputs.
void test_lowbit_fused_input(const LowbitCase& c, bool swiglu, int row, bool bias, bool acc) {
  LowbitMatrix m(c);
  const std::vector<double> wd(m.wf.begin(), m.wf.end());
  check_gemv_fused_input(m.dev_view, wd, lbshape(c).c_str(), swiglu, row, bias, acc);
}

void run_lowbit_tests() {
  const std::vector<LowbitCase> cases = {
      {GgmlType::Q8_0, 100, 256},
      {GgmlType::Q8_0, 1000, 4096},
      {GgmlType::Q8_0, 33, 96},
      {GgmlType::F8_E4M3, 100, 259},  // cols not a multiple of 16: a partial chunk
      {GgmlType::F8_E4M3, 1000, 4096},
      {GgmlType::F8_E4M3, 77, 300, 128},       // block-wise scales, the last group partial
      {GgmlType::F8_E4M3, 45, 200, 40},        // groups that 16-column chunks straddle
      {GgmlType::F8_E4M3, 31, 64, 0, true},    // one scale
      {GgmlType::TERNARY, 100, 256},           // per row
      {GgmlType::TERNARY, 1000, 4096, 256},    // per 256 columns (TQ1_0 / TQ2_0)
      {GgmlType::TERNARY, 37, 80, 16},         // per word; a partial 64-trit chunk
      {GgmlType::TERNARY, 65, 1040, 0, true},  // per tensor; a partial chunk
  };
  const std::vector<int> ns = g_quick ? std::vector<int>{1, 3, 32} : std::vector<int>{1, 2, 3, 5, 8, 17, 32};
  if (enabled("lowbit_gemv"))
    for (const LowbitCase& c : cases)
      for (int n : ns) test_lowbit_mm(c, n, n % 2 == 1, n == 3 || n == 17 || n == 32, nullptr);
  if (enabled("lowbit_gemv")) {  // >= 4096 rows: the tiles of 2 or 4 rows per warp (dispatch_lb)
    for (int n : g_quick ? std::vector<int>{1, 32} : std::vector<int>{1, 2, 3, 5, 8, 17, 32}) {
      test_lowbit_mm({GgmlType::Q8_0, 4099, 512}, n, true, n % 2 == 1, nullptr);
      test_lowbit_mm({GgmlType::F8_E4M3, 4101, 528}, n, n % 2 == 0, true, nullptr);
      test_lowbit_mm({GgmlType::TERNARY, 4103, 528, 16}, n, true, false, nullptr);
    }
    // One row of F8_E4M3 with a scale per row or tensor: the weight-streaming kernel (several 4 KB segments
    // per row; more rows than SMs x 8 warps), and past its widest x (16384 columns: the SIMT kernel).
    test_lowbit_mm({GgmlType::F8_E4M3, 4096, 14336}, 1, true, false, nullptr);
    test_lowbit_mm({GgmlType::F8_E4M3, 2500, 16384, 0, true}, 1, false, true, nullptr);
    test_lowbit_mm({GgmlType::F8_E4M3, 300, 16400}, 1, true, true, nullptr);
    // The tensor-core kernel (gemv_lowbit_tc.cu) up to n = 8 (n * cols <= 16384; one MMA with hi and lo
    // in its columns up to n = 4, two above), a partial row tile, x large or small enough that it is scaled
    // by a power of two before its f16 parts are formed, 1-8 tiles per block; TERNARY also with a last step
    // of 64, 128 or 192 of its 256 columns.
    for (GgmlType t : {GgmlType::F8_E4M3, GgmlType::TERNARY}) {
      for (int n : {4, 5, 8}) test_lowbit_mm({t, 777, 2048}, n, n == 5, n != 5, nullptr);
      test_lowbit_mm({t, 1000, 4096}, 2, true, true, nullptr, 3.0e5f);
      test_lowbit_mm({t, 64, 1024, 0, true}, 8, false, false, nullptr, 1e-6f);
      test_lowbit_mm({t, 64, 1024, 0, true}, 3, true, false, nullptr, 1e-6f);
      test_lowbit_mm({t, 25000, 512}, 1, true, false, nullptr);  // 4 / 8 tiles per block
      test_lowbit_mm({t, 50001, 256}, 3, false, true, nullptr);
    }
    for (int64_t cols : {64, 320, 896, 1472})
      for (int n : {1, 4, 6})
        test_lowbit_mm({GgmlType::TERNARY, 300, cols, 0, n == 4}, n, n != 1, n == 6, nullptr);
    // Its bulk-copy variant: 1-4 ring slots (one slot: every item waits for its own copy; more items than
    // slots: the slots refilled), a last item of 1-3 steps, TERNARY's partial last step, rows past the end,
    // 1-8 tiles per block, n = 1-8, a tile's columns split among 1-8 warps.
    for (GgmlType t : {GgmlType::F8_E4M3, GgmlType::TERNARY})
      for (int slots : {0, 1, 2, 4}) {
        test_lowbit_mm({t, 777, 2048}, 5, true, false, nullptr, 1.0f, slots);
        test_lowbit_mm({t, 1000, 4096}, 2, false, true, nullptr, 3.0e5f, slots);
        test_lowbit_mm({t, 301, 16384, 0, true}, 1, true, true, nullptr, 1.0f, slots);
        test_lowbit_mm({t, 4100, 1536}, 8, false, false, nullptr, 1e-6f, slots);
        test_lowbit_mm({t, 25000, 512}, 3, true, false, nullptr, 1.0f, slots);
        test_lowbit_mm({t, 300, 1472, 0, true}, 4, true, true, nullptr, 1.0f, slots);
        test_lowbit_mm({t, 3000, 13376}, 1, false, false, nullptr, 1.0f, slots);
      }
  }
  if (enabled("gemv_fused")) {  // widths the tensor-core kernel does not take (cols % 64 != 0)
    test_lowbit_fused_input({GgmlType::F8_E4M3, 6144, 4112}, false, 1, true, false);
    test_lowbit_fused_input({GgmlType::F8_E4M3, 700, 1040, 0, true}, false, -2, false, true);
    test_lowbit_fused_input({GgmlType::F8_E4M3, 4096, 14352}, true, 0, false, true);
  }
  if (enabled("lowbit_matmul")) {
    int64_t max_elems = 0;
    for (const LowbitCase& c : cases) max_elems = std::max(max_elems, c.rows * lowbit_bf16_ld(c.cols));
    max_elems = std::max<int64_t>(max_elems, 4096 * 1024);
    DevBuf<uint8_t> ws(CudaMatmul::workspace_bytes(512, 4096, max_elems));
    CudaMatmul mm;
    CK(mm.init(ws.get(), ws.size()));
    for (const LowbitCase& c : cases) {
      test_lowbit_mm(c, 40, true, false, &mm);
      test_lowbit_mm(c, 100, false, true, &mm);
      test_lowbit_mm(c, kLowbitGemvMaxRows, true, true, &mm);  // the low-bit gemv through the same entry
      test_lowbit_mm(c, 5, true, true, &mm);                   // the BF16 copy through the tensor-core gemv
    }
    // F8_E4M3 through cuBLASLt's FP8 GEMM (x quantised per row to E4M3: ~2^-4 relative per element at most,
    // ~3% rms; bound 6e-2, where a wrong scale would give ~1), a scale per row and per tensor, with the
    // bias and accumulation epilogues, x scaled far from 1 (the per-row scale absorbs it); the shapes it
    // does not take (cols % 16 != 0, scales per column group) fall back to the BF16 copy (1e-2).
    tuning::set_fp8_gemm(1);
    for (const LowbitCase& c :
         {LowbitCase{GgmlType::F8_E4M3, 1000, 4096}, LowbitCase{GgmlType::F8_E4M3, 31, 64, 0, true},
          LowbitCase{GgmlType::F8_E4M3, 4096, 1024}, LowbitCase{GgmlType::F8_E4M3, 300, 2048, 0, true}}) {
      test_lowbit_mm(c, 40, true, false, &mm, 1.0f, -1, 6e-2);
      test_lowbit_mm(c, 100, false, true, &mm, 1e-4f, -1, 6e-2);
      test_lowbit_mm(c, 512, true, true, &mm, 2e3f, -1, 6e-2);
      test_lowbit_mm(c, 9, false, false, &mm, 1.0f, -1, 6e-2);
    }
    // A plan cuBLASLt refused falls back to the BF16 copy (which the bound above would also pass), and
    // leaves its status behind: none may have.
    report(mm.last_cublas_status() == 0, "fp8_gemm_plan", "every FP8 GEMM above had a cuBLASLt plan", NAN, 0,
           fmt("cublas status %d", mm.last_cublas_status()).c_str());
    test_lowbit_mm({GgmlType::F8_E4M3, 100, 259}, 40, true, false, &mm);
    test_lowbit_mm({GgmlType::F8_E4M3, 77, 300, 128}, 40, true, true, &mm);
    tuning::set_fp8_gemm(0);
  }
  if (enabled("lowbit_embed"))
    for (const LowbitCase& c : cases) test_lowbit_embed(c, 33);
}

// =====================================================================================================
// attention

struct AttnCase {
  GgmlType t;
  int hd, n_heads, n_kv;
  std::vector<int32_t> pos, seq;
  int force_splits;
  int mode = 0;     // tuning::set_attention_tiled: 0 automatic, 1 per-row kernel, 2 tiled kernel for any n
  int max_ctx = 0;  // 0: the largest position + 3 (else rows past it attend the whole slot)
  const char* what = "";
  float softcap = 0;   // > 0: scores softcap tanh(s / softcap) (Gemma 2)
  int window = 0;      // > 0: positions > pos - window only (sliding-window layers)
  bool sinks = false;  // gpt-oss: a sink logit per head in the softmax's denominator (the last one 50: above
                       // every score, so that head's output is tiny)
};

// Bounds. The per-row kernel is f32 accurate: ||err|| / ||ref|| <= 1e-5. The tiled kernel (kernels.h)
// rounds Q and the probabilities P to the cache type before its MMAs (K and V are exact as stored, sums in
// f32): each logit gets an error of about u * scale * |q . k| spread over head_dim terms (~u for unit-
// variance logits), each probability a relative error <= u, so an output row is off by about u times the
// spread of the V rows it averages. A float64 emulation of exactly these roundings on the data below gave
// max |err| / max |ref| <= 0.9u over a case and <= 1.5u for the worst single (row, head); the bound is 4u
// on both, u the unit roundoff of the cache type (2^-11 for F16, 2^-8 for BF16).
double tiled_unit_roundoff(GgmlType t) {
  return t == GgmlType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

void test_attention(const AttnCase& c) {
  const int n = (int)c.pos.size(), n_slots = 3;
  int max_pos = 0;
  for (int p : c.pos) max_pos = std::max(max_pos, p);
  const int max_ctx = c.max_ctx > 0 ? c.max_ctx : max_pos + 3;
  const int hd = c.hd, group = c.n_heads / c.n_kv;
  const size_t ce = (size_t)n_slots * c.n_kv * max_ctx * hd;
  std::vector<double> kd, vd;
  auto kb = encode(c.t, randn(ce), &kd), vb = encode(c.t, randn(ce), &vd);
  auto q = randn((size_t)n * c.n_heads * hd);
  DevBuf<uint8_t> dk(kb.size()), dv(vb.size());
  dk.put(kb);
  dv.put(vb);
  DevBuf<float> dq(q.size()), dout(q.size());
  dq.put(q);
  dout.poison();
  DevBuf<int32_t> dp(n), ds(n);
  dp.put(c.pos);
  ds.put(c.seq);
  KvLayerView kv{c.t, dk.get(), dv.get(), n_slots, c.n_kv, max_ctx, hd};
  tuning::set_attention_tiled(c.mode);
  const AttentionPlan plan = plan_attention(g_dev, kv, c.n_heads, n, c.force_splits);
  // (the tiled kernel has no windows or soft-capping: attention() takes the per-row kernel for those)
  const bool tiled = attention_tiled(plan, n) && c.window == 0 && c.softcap == 0;
  std::vector<float> sinks;
  if (c.sinks) {
    sinks = randn((size_t)c.n_heads);
    for (float& v : sinks) v *= 2.0f;
    sinks.back() = 50.0f;
  }
  DevBuf<float> dsinks(std::max<size_t>(sinks.size(), 1));
  if (c.sinks) dsinks.put(sinks);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  const float scale = 1.0f / std::sqrt((float)hd);
  auto padding = [&](int t) { return c.seq[t] < 0 || c.seq[t] >= n_slots || c.pos[t] < 0; };
  int n_pad = 0;
  for (int t = 0; t < n; ++t) n_pad += padding(t);
  const std::string shape =
      fmt("%s hd=%d heads=%d kv=%d n=%d ctx<=%d splits=%d pad=%d%s%s%s%s", tname(c.t), hd, c.n_heads, c.n_kv,
          n, std::min(max_pos + 1, max_ctx), plan.n_splits, n_pad,
          c.window || c.softcap ? fmt(" window=%d softcap=%g", c.window, c.softcap).c_str() : "",
          c.sinks ? " sinks" : "", *c.what ? " " : "", c.what);
  const cudaError_t e0 = attention(plan, kv, dq.get(), n, dp.get(), ds.get(), scale, dout.get(), ws.get(), 0,
                                   c.softcap, c.window, c.sinks ? dsinks.get() : nullptr);
  tuning::set_attention_tiled(0);
  const char* path = tiled ? "(tiled)" : "(per-row)";
  if (e0 != cudaSuccess) {
    report(false, "attention", shape, NAN, 0, fmt("%s %s", path, cudaGetErrorString(e0)).c_str());
    return;
  }
  CK(cudaDeviceSynchronize());
  std::vector<double> ref(q.size(), 0.0);
  for (int t = 0; t < n; ++t) {
    if (padding(t)) continue;
    const int len = std::min(c.pos[t] + 1, max_ctx);
    const int lo = c.window > 0 ? std::min(std::max(0, c.pos[t] - c.window + 1), len) : 0;
    std::vector<double> sc(len);
    for (int h = 0; h < c.n_heads; ++h) {
      const size_t base = (((size_t)c.seq[t] * c.n_kv + h / group) * max_ctx) * hd;
      const float* qh = &q[((size_t)t * c.n_heads + h) * hd];
      double m = -INFINITY;
      for (int p = lo; p < len; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += (double)qh[i] * kd[base + (size_t)p * hd + i];
        sc[p] = d * scale;
        if (c.softcap > 0) sc[p] = c.softcap * std::tanh(sc[p] / c.softcap);
        m = std::max(m, sc[p]);
      }
      const double sink = c.sinks ? (double)sinks[h] : -INFINITY;  // cpu::attention_ref's sink term
      m = std::max(m, sink);
      double sum = std::exp(sink - m);
      for (int p = lo; p < len; ++p) sum += (sc[p] = std::exp(sc[p] - m));
      double* o = &ref[((size_t)t * c.n_heads + h) * hd];
      for (int p = lo; p < len; ++p)
        for (int i = 0; i < hd; ++i) o[i] += sc[p] / sum * vd[base + (size_t)p * hd + i];
    }
  }
  const std::vector<float> got = dout.all();
  if (!tiled) {
    const double e = rel_err(got, ref);
    report(ok_err(e, 1e-5), "attention", shape, e, 1e-5, path);
    return;
  }
  // tiled: max |err| / max |ref| over the case and over each (row, head); padding rows exactly zero
  double max_err = 0, max_ref = 0, worst = 0;
  bool pad_ok = true;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < c.n_heads; ++h) {
      const size_t o = ((size_t)t * c.n_heads + h) * hd;
      double em = 0, rm = 0;
      for (int i = 0; i < hd; ++i) {
        const double d = std::isfinite(got[o + i]) ? std::fabs(got[o + i] - ref[o + i]) : INFINITY;
        em = std::max(em, d);
        rm = std::max(rm, std::fabs(ref[o + i]));
        if (padding(t) && got[o + i] != 0.0f) pad_ok = false;
      }
      max_err = std::max(max_err, em);
      max_ref = std::max(max_ref, rm);
      if (!padding(t)) worst = std::max(worst, em / rm);
    }
  const double u = tiled_unit_roundoff(c.t), bound = 4 * u, whole = max_err / max_ref;
  const bool ok = ok_err(whole, bound) && ok_err(worst, bound) && pad_ok;
  report(ok, "attention", shape, std::max(whole, worst), bound,
         fmt("(tiled) case %.2fu, worst row-head %.2fu%s", whole / u, worst / u,
             pad_ok ? "" : ", PADDING NONZERO")
             .c_str());
}

// The tiled prefill kernel (forced for any n) on causal chunks, mixed batches and padding, F16 / BF16 caches.
void test_attention_tiled_cases() {
  auto run = [](std::vector<int32_t> pos, std::vector<int32_t> seq, const char* what) {
    for (GgmlType t : {GgmlType::F16, GgmlType::BF16})
      for (int hd : {64, 128}) {
        for (auto [nh, nkv] : std::vector<std::pair<int, int>>{{4, 4}, {16, 4}, {32, 4}, {24, 4}})
          test_attention({t, hd, nh, nkv, pos, seq, 0, 2, 0, what});
      }
  };
  auto chunk = [](std::vector<int32_t>& pos, std::vector<int32_t>& seq, int s, int p0, int count) {
    for (int i = 0; i < count; ++i) pos.push_back(p0 + i), seq.push_back(s);
  };
  {  // single-sequence chunks: from position 0, and continuing a cached prefix
    for (auto [p0, count] : std::vector<std::pair<int, int>>{{0, 37}, {0, 257}, {300, 100}, {2000, 37}}) {
      if (g_quick && count > 100) continue;
      std::vector<int32_t> pos, seq;
      chunk(pos, seq, 1, p0, count);
      run(pos, seq, p0 ? "chunk after prefix" : "chunk from 0");
    }
  }
  {  // mixed batch: two chunks, decode rows, padding (seq -1, pos -1) at the ends and inside
    std::vector<int32_t> pos, seq;
    chunk(pos, seq, 0, 0, 70);
    pos.push_back(5), seq.push_back(-1);
    chunk(pos, seq, 2, 200, 45);
    for (auto [p, s] :
         std::vector<std::pair<int, int>>{{900, 1}, {69, 0}, {0, 1}, {17, -1}, {33, 2}, {-1, 1}})
      pos.push_back(p), seq.push_back(s);
    run(pos, seq, "mixed");
  }
  {  // two sequences interleaved row by row (no uniform tile: all rows go to the fallback blocks)
    std::vector<int32_t> pos, seq;
    for (int i = 0; i < 50; ++i) pos.push_back(i), seq.push_back(0), pos.push_back(400 + i), seq.push_back(2);
    pos.push_back(0), seq.push_back(-1);
    run(pos, seq, "interleaved");
  }
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
    // decode-sized steps through the tiled kernel
    test_attention({t, 128, 32, 8, {16, 999, 5, 300, 0}, {0, 1, -1, 2, 1}, 0, 2, 0, "decode rows"});
    // rows past max_ctx attend the whole slot
    std::vector<int32_t> pos, seq;
    for (int i = 0; i < 40; ++i) pos.push_back(90 + i), seq.push_back(2);
    test_attention({t, 64, 8, 1, pos, seq, 0, 2, 100, "past max_ctx"});
    // GQA 16 (4 rows per tile): tiles whose first and last rows look like one run (sequence 1 at p, p + 3)
    // but hold a padding row and a row of another sequence between them
    std::vector<int32_t> tp, ts;
    for (int k = 0; k < 10; ++k)
      for (auto [p, s] :
           std::vector<std::pair<int, int>>{{10 + 4 * k, 1}, {3, -1}, {5 + 4 * k, 2}, {13 + 4 * k, 1}})
        tp.push_back(p), ts.push_back(s);
    for (int hd : {64, 128}) test_attention({t, hd, 32, 2, tp, ts, 0, 2, 0, "foreign rows inside tiles"});
    // GQA 12 (4 heads per block, 3 head chunks), 7 kv heads
    test_attention({t, 128, 84, 7, std::vector<int32_t>(pos.begin(), pos.begin() + 33),
                    std::vector<int32_t>(seq.begin(), seq.begin() + 33), 0, 2, 0, "gqa 12"});
  }
}

// =====================================================================================================
// sampler: the reference implementation of the function specified in kernels.h (float64 where it says
// double; e = exp in double rounded to f32). It also returns the smallest relative margin of its decisions
// (min-p compare, top-p cut, draw): a GPU token that differs is accepted only when that margin is < 1e-5.

struct RefSample {
  int token = 0;
  float logprob = 0;
  std::vector<std::pair<int, float>> top;
  int err = 0;
  double margin = 1.0;
};

// rules: the row has logit rules (SamplerRow::rules): -infinity is a refused token, not an error.
RefSample ref_sample(const float* logits, int n, const SamplerRow& p, const std::vector<int32_t>& hist,
                     bool rules = false) {
  RefSample r;
  for (int i = 0; i < n; ++i)
    if (!std::isfinite(logits[i]) && !(rules && logits[i] == -INFINITY)) {
      r.err = 1;
      return r;
    }
  std::vector<float> l(logits, logits + n);
  if (!hist.empty() &&
      (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)) {
    std::map<int, unsigned> cnt;
    for (int t : hist)
      if (t >= 0 && t < n) ++cnt[t];
    for (auto [t, c] : cnt) {
      float v = l[t];
      v = v <= 0.0f ? v * p.repeat_penalty : v / p.repeat_penalty;
      v = v - ((float)c * p.frequency_penalty + p.presence_penalty);
      l[t] = v;
    }
  }
  const int n_probs = std::clamp(p.n_probs, 0, kSamplerMaxProbs);
  std::vector<int> ord(n);
  for (int i = 0; i < n; ++i) ord[i] = i;
  auto better = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  if (!(p.temperature > 0.0f)) {
    const int kk = std::max(1, n_probs);
    std::partial_sort(ord.begin(), ord.begin() + kk, ord.end(), better);
    const float M = l[ord[0]];
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += l[i] == M ? 1.0 : std::exp((double)l[i] - M);
    const double ls = std::log(sum);
    r.token = ord[0];
    r.logprob = (float)(0.0 - ls);
    for (int j = 0; j < std::min(n_probs, n); ++j) {
      const float v = l[ord[j]];
      r.top.push_back({ord[j], (float)((v == M ? 0.0 : (double)v - M) - ls)});
    }
    return r;
  }
  std::sort(ord.begin(), ord.end(), better);
  const int k = (p.top_k <= 0 || p.top_k >= n) ? n : p.top_k;
  const float l0 = l[ord[0]], T = p.temperature;
  std::vector<float> e(k);
  for (int j = 0; j < k; ++j) {
    const float v = l[ord[j]];
    e[j] = v == l0 ? 1.0f : (float)std::exp((double)((v - l0) / T));
  }
  auto mg = [&](double a, double b, double scale) {
    r.margin = std::min(r.margin, std::fabs(a - b) / scale);
  };
  int m = k;
  if (p.min_p > 0.0f) {
    const float thr = p.min_p * e[0];
    m = 1;
    while (m < k && e[m] >= thr) ++m;
    if (m < k) mg(e[m], thr, thr);
    if (m > 1) mg(e[m - 1], thr, thr);
  }
  double sum = 0;
  for (int j = 0; j < m; ++j) sum += e[j];
  if (p.top_p < 1.0f) {
    const double target = (double)p.top_p * sum;
    double cum = 0;
    int m2 = 0;
    while (m2 < m) {
      cum += e[m2++];
      if (cum >= target) break;
    }
    mg(cum, target, sum);
    if (m2 >= 1) mg(cum - e[m2 - 1], target, sum);
    m = m2;
    sum = cum;
  }
  std::vector<float> pr(m);
  const double inv = 1.0 / sum;
  double total = 0;
  for (int j = 0; j < m; ++j) total += (pr[j] = (float)(e[j] * inv));
  const double target = philox_uniform(p.seed, p.position, DrawStream::token) * total;
  double cum = 0;
  int pick = -1;
  for (int j = 0; j < m; ++j) {
    const double before = cum;
    cum += pr[j];
    if (target < cum) {
      pick = j;
      mg(target, before, total);
      mg(target, cum, total);
      break;
    }
  }
  if (pick < 0) {
    pick = m - 1;
    while (pick > 0 && pr[pick] == 0.0f) --pick;
  }
  const double ls = std::log(sum);
  auto lp = [&](int j) {
    const float v = l[ord[j]];
    return (float)((v == l0 ? 0.0 : ((double)v - l0) / T) - ls);
  };
  r.token = ord[pick];
  r.logprob = lp(pick);
  for (int j = 0; j < std::min(n_probs, m); ++j) r.top.push_back({ord[j], lp(j)});
  return r;
}

struct SampCase {
  const char* name;
  SamplerRow p;  // hist / logits_row filled by the test
  std::vector<int32_t> hist;
  int logits_kind;  // 0: peaked N(0, 3); 1: flat U(0, 0.2); 2: one NaN; 3: peaked + a few ties
};

SamplerRow row_params(float T, int top_k, float top_p, float min_p, int n_probs, float rp = 1.0f,
                      float pp = 0.0f, float fp = 0.0f) {
  SamplerRow p{};
  p.temperature = T;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = rp;
  p.presence_penalty = pp;
  p.frequency_penalty = fp;
  p.n_probs = n_probs;
  p.seed = g_rng();
  p.position = (int64_t)(g_rng() % 100000);
  return p;
}

void test_sampler(int V, int n_sample, std::vector<SampCase> cases) {
  const int n_rows = (int)cases.size();
  const int n_lrows = n_rows + 1;  // the last logits row is never sampled
  std::vector<float> logits((size_t)n_lrows * V);
  for (int r = 0; r < n_lrows; ++r) {
    const int kind = r < n_rows ? cases[r].logits_kind : 0;
    auto v = kind == 1 ? randu(V, 0.0f, 0.2f) : randn(V, 3.0f);
    if (kind == 2) v[randi(0, n_sample - 1)] = NAN;
    if (kind == 3)
      for (int i = 0; i < 8; ++i) v[randi(0, n_sample - 1)] = v[i];  // exact ties, broken by id
    std::copy(v.begin(), v.end(), logits.begin() + (size_t)r * V);
  }
  // hist pool
  std::vector<int32_t> pool;
  std::vector<size_t> off(n_rows);
  for (int r = 0; r < n_rows; ++r) {
    off[r] = pool.size();
    pool.insert(pool.end(), cases[r].hist.begin(), cases[r].hist.end());
  }
  DevBuf<float> dl(logits.size());
  dl.put(logits);
  DevBuf<int32_t> dh(pool.size());
  if (!pool.empty()) dh.put(pool);
  std::vector<SamplerRow> rows(n_rows);
  for (int r = 0; r < n_rows; ++r) {
    rows[r] = cases[r].p;
    rows[r].hist = cases[r].hist.empty() ? nullptr : dh.get() + off[r];
    rows[r].n_hist = (int32_t)cases[r].hist.size();
    if (rows[r].logits_row != -1) rows[r].logits_row = r;
  }
  DevBuf<SamplerRow> dr(n_rows);
  dr.put(rows);
  SamplerPlan plan;
  CK(plan_sampler(g_dev, n_rows, V, kSamplerMaxHistory, &plan));
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  CK(sampler_workspace_init(plan, ws.get(), 0));
  DevBuf<int32_t> tok(n_rows), err(n_rows), ttok((size_t)n_rows * kSamplerMaxProbs);
  DevBuf<float> lp(n_rows), tlp((size_t)n_rows * kSamplerMaxProbs);
  SamplerOutputs so{tok.get(), lp.get(), ttok.get(), tlp.get(), err.get()};
  std::vector<int32_t> first_tok;
  for (int run = 0; run < 2; ++run) {  // the second run checks that the workspace was left clean
    tok.poison(), err.poison(), ttok.poison(), lp.poison(), tlp.poison();
    CK(sample(plan, dl.get(), V, n_sample, dr.get(), n_rows, so, ws.get(), 0));
    CK(cudaDeviceSynchronize());
    auto ht = tok.all(), he = err.all(), htt = ttok.all();
    auto hl = lp.all(), htl = tlp.all();
    if (run == 1) {
      const bool same = ht == first_tok;
      report(same, "sampler", fmt("V=%d n_sample=%d rows=%d: second launch identical", V, n_sample, n_rows),
             same ? 0.0 : 1.0, 0.0);
      break;
    }
    first_tok = ht;
    for (int r = 0; r < n_rows; ++r) {
      const SampCase& c = cases[r];
      const std::string shape = fmt("V=%d n=%d %s", V, n_sample, c.name);
      if (rows[r].logits_row < 0) {
        const bool ok = ht[r] == -1 && he[r] == 0 && std::isnan(hl[r]);
        report(ok, "sampler", shape + " (skipped row)", ok ? 0 : 1, 0);
        continue;
      }
      const RefSample ref = ref_sample(&logits[(size_t)r * V], n_sample, c.p, c.hist);
      if (ref.err) {
        const bool ok = he[r] == 1 && ht[r] == 0;
        report(ok, "sampler", shape + " (NaN row -> error flag)", ok ? 0 : 1, 0);
        continue;
      }
      double lerr = std::fabs((double)hl[r] - ref.logprob);
      bool ok = he[r] == 0;
      const bool tok_ok = ht[r] == ref.token;
      const bool tie = !tok_ok && ref.margin < 1e-5;
      std::string extra;
      if (!tok_ok)
        extra += fmt("token gpu=%d ref=%d margin=%.1e%s ", ht[r], ref.token, ref.margin,
                     tie ? " (near-tie: accepted)" : "");
      if (tok_ok) {
        ok = ok && lerr <= 1e-4;
        const int nt = (int)ref.top.size();
        for (int j = 0; j < kSamplerMaxProbs; ++j) {
          const int gt = htt[(size_t)r * kSamplerMaxProbs + j];
          const float gl = htl[(size_t)r * kSamplerMaxProbs + j];
          if (j < nt) {
            if (gt != ref.top[j].first)
              ok = false, extra += fmt("top[%d] gpu=%d ref=%d ", j, gt, ref.top[j].first);
            lerr = std::max(lerr, std::fabs((double)gl - ref.top[j].second));
          } else if (gt != -1 || !(gl == -INFINITY)) {
            ok = false, extra += fmt("top[%d] not cleared ", j);
          }
        }
        ok = ok && lerr <= 1e-4;
      } else {
        ok = ok && tie;
      }
      report(ok, "sampler", shape, lerr, 1e-4, extra.c_str());
    }
  }
}

std::vector<int32_t> rand_hist(int count, int n_sample, int distinct) {
  std::vector<int32_t> h(count);
  std::vector<int32_t> pool(distinct);
  for (auto& t : pool) t = randi(0, n_sample - 1);
  for (auto& t : h) t = pool[randi(0, distinct - 1)];
  if (count > 3) h[0] = n_sample + 10, h[1] = -1;  // ignored
  return h;
}

void run_sampler_tests(int V, int n_sample) {
  std::vector<SampCase> cs;
  auto add = [&](const char* name, SamplerRow p, int kind, std::vector<int32_t> hist = {}) {
    cs.push_back({name, p, std::move(hist), kind});
  };
  add("greedy", row_params(0.0f, 40, 1.0f, 0.0f, 0), 0);
  add("greedy n_probs=20", row_params(0.0f, 0, 1.0f, 0.0f, 20), 0);
  add("greedy ties n_probs=5", row_params(-1.0f, 0, 1.0f, 0.0f, 5), 3);
  add("greedy penalties", row_params(0.0f, 0, 1.0f, 0.0f, 3, 1.3f, 0.2f, 0.1f), 0,
      rand_hist(64, n_sample, 20));
  add("top_k=40 T=0.8", row_params(0.8f, 40, 1.0f, 0.0f, 5), 0);
  add("top_k=40 top_p=0.9 min_p=0.05", row_params(0.8f, 40, 0.9f, 0.05f, 20), 0);
  add("top_k=1", row_params(1.0f, 1, 1.0f, 0.0f, 2), 0);
  add("top_k=1024 top_p=0.95 T=1.5", row_params(1.5f, 1024, 0.95f, 0.0f, 10), 0);
  add("top_k=1024 flat", row_params(1.0f, 1024, 1.0f, 0.0f, 4), 1);
  add("top_k=200 penalties W=4096", row_params(1.0f, 200, 0.9f, 0.0f, 3, 1.1f, 0.5f, 0.05f), 0,
      rand_hist(4096, n_sample, 3000));
  add("top_k=0 min_p=0.05", row_params(1.0f, 0, 1.0f, 0.05f, 5), 0);
  add("top_k=0 min_p=0.02 top_p=0.9 T=2", row_params(2.0f, 0, 0.9f, 0.02f, 5), 0);
  add("top_k=0 top_p=0.9 flat (large)", row_params(1.0f, 0, 0.9f, 0.0f, 5), 1);
  add("top_k=0 top_p=1 flat (large)", row_params(1.0f, 0, 1.0f, 0.0f, 3), 1);
  add("top_k=0 top_p=0.5 T=3 peaked", row_params(3.0f, 0, 0.5f, 0.0f, 1), 0);
  add("top_k=3000 flat", row_params(1.0f, 3000, 1.0f, 0.0f, 2), 1);
  add("top_k=20000 top_p=0.7 flat", row_params(1.0f, 20000, 0.7f, 0.0f, 2), 1);
  add("top_k=0 min_p=0.9 flat", row_params(1.0f, 0, 0.95f, 0.9f, 2), 1);
  add("top_k=0 min_p=2 (keeps 1)", row_params(1.0f, 0, 1.0f, 2.0f, 2), 0);
  add("top_k=0 top_p=0 (keeps 1)", row_params(1.0f, 0, 0.0f, 0.0f, 2), 0);
  add("penalties W=32768", row_params(0.7f, 50, 1.0f, 0.0f, 3, 1.5f, 0.0f, 0.0f), 0,
      rand_hist(kSamplerMaxHistory, n_sample, std::min(n_sample, 20000)));
  add("NaN logit", row_params(0.8f, 40, 1.0f, 0.0f, 0), 2);
  {
    SamplerRow p = row_params(0.8f, 40, 1.0f, 0.0f, 3);
    p.logits_row = -1;
    add("logits_row=-1", p, 0);
  }
  if (g_quick) cs.resize(8);
  test_sampler(V, n_sample, cs);
}

// =====================================================================================================
// logit rules (backend_kernels.h logit_rules: a grammar mask read from pinned host memory, logit biases)
// against the host's apply_logit_rules (written again here), then the sampler on the ruled logits (-inf:
// refused tokens) against ref_sample.

struct RuleCase {
  const char* name;
  int n_allowed;     // tokens the mask allows (0: no mask)
  bool bias;         // a bias list: duplicates, a ban, ids out of range
  bool nan_refused;  // a NaN logit at a refused token (flagged, then -inf)
  SamplerRow p;      // logits_row = -1: rules only (an Output::logits row)
};

void test_logit_rules(int V, int n_sample, const std::vector<RuleCase>& cs) {
  const int n_rows = (int)cs.size();
  const size_t stride = ((size_t)(n_sample + 31) / 32 + 3) / 4 * 4;  // mask words per row (16-byte rows)
  uint32_t* h_mask = nullptr;
  RuleBias* h_bias = nullptr;
  CK(cudaMallocHost((void**)&h_mask, (size_t)n_rows * stride * 4));
  CK(cudaMallocHost((void**)&h_bias, (size_t)n_rows * kRuleMaxBias * sizeof(RuleBias)));
  std::memset(h_mask, 0, (size_t)n_rows * stride * 4);
  std::vector<float> logits((size_t)n_rows * V), want;
  std::vector<SamplerRow> rows(n_rows);
  std::vector<int> want_bad(n_rows, 0);
  for (int r = 0; r < n_rows; ++r) {
    const RuleCase& c = cs[r];
    auto v = randn(V, 3.0f);
    float* l = &logits[(size_t)r * V];
    std::copy(v.begin(), v.end(), l);
    SamplerRow& p = rows[r] = c.p;
    if (p.logits_row != -1) p.logits_row = r;
    uint32_t* m = h_mask + (size_t)r * stride;
    if (c.n_allowed > 0) {
      for (int k = 0; k < c.n_allowed; ++k) {
        const int t = randi(0, n_sample - 1);
        m[t >> 5] |= 1u << (t & 31);
      }
      p.allow = m;
    }
    if (c.nan_refused)
      for (int t = 0; t < n_sample; ++t)
        if (!((m[t >> 5] >> (t & 31)) & 1u)) {
          l[t] = NAN;
          break;
        }
    if (c.bias) {
      RuleBias* b = h_bias + (size_t)r * kRuleMaxBias;
      int nb = 0;
      const int t0 = randi(0, n_sample - 1), t1 = randi(0, n_sample - 1);
      b[nb++] = {t0, 2.5f};
      b[nb++] = {t1, -100.0f};         // banned
      b[nb++] = {n_sample + 3, 5.0f};  // out of range: ignored
      b[nb++] = {-1, 5.0f};
      b[nb++] = {t0, 1.25f};  // listed twice: both added, in order
      for (int k = 0; k < 40; ++k) b[nb++] = {randi(0, n_sample - 1), (float)randn(1, 2.0f)[0]};
      if (c.n_allowed > 0)  // an allowed token, boosted to the top
        for (int t = 0; t < n_sample; ++t)
          if ((m[t >> 5] >> (t & 31)) & 1u) {
            b[nb++] = {t, 30.0f};
            break;
          }
      p.bias = b;
      p.n_bias = nb;
    }
    p.rules = p.allow || p.n_bias > 0;
  }
  // The host's rules (sampling/sampler.cpp apply_logit_rules).
  want = logits;
  for (int r = 0; r < n_rows; ++r) {
    float* l = &want[(size_t)r * V];
    const SamplerRow& p = rows[r];
    if (!p.rules) continue;
    for (int t = 0; t < n_sample; ++t) want_bad[r] |= !std::isfinite(l[t]);
    if (p.allow)
      for (int t = 0; t < n_sample; ++t)
        if (!((p.allow[t >> 5] >> (t & 31)) & 1u)) l[t] = -INFINITY;
    for (int k = 0; k < p.n_bias; ++k) {
      const RuleBias& b = p.bias[k];
      if (b.token < 0 || b.token >= n_sample) continue;
      l[b.token] = b.bias <= -100.0f ? -INFINITY : l[b.token] + b.bias;
    }
  }
  DevBuf<float> dl(logits);
  DevBuf<SamplerRow> dr(rows);
  DevBuf<int32_t> bad(n_rows);
  bad.poison();
  CK(logit_rules(dl.get(), V, n_sample, dr.get(), n_rows, bad.get(), 0));
  CK(cudaDeviceSynchronize());
  const std::vector<float> got = dl.all();
  const std::vector<int32_t> gbad = bad.all();
  for (int r = 0; r < n_rows; ++r) {
    size_t n_diff = 0;
    for (int t = 0; t < V; ++t) {
      const float a = got[(size_t)r * V + t], b = want[(size_t)r * V + t];
      n_diff += !(a == b || (std::isnan(a) && std::isnan(b)));
    }
    const bool ok = n_diff == 0 && gbad[r] == want_bad[r];
    report(ok, "logit_rules", fmt("V=%d n=%d %s", V, n_sample, cs[r].name), (double)n_diff, 0,
           fmt("flag gpu=%d want=%d", gbad[r], want_bad[r]).c_str());
  }
  // The sampler on the ruled logits (its own flag is not the row's: rows with rules take logit_rules').
  SamplerPlan plan;
  CK(plan_sampler(g_dev, n_rows, V, 16, &plan));
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  CK(sampler_workspace_init(plan, ws.get(), 0));
  DevBuf<int32_t> tok(n_rows), err(n_rows), ttok((size_t)n_rows * kSamplerMaxProbs);
  DevBuf<float> lp(n_rows), tlp((size_t)n_rows * kSamplerMaxProbs);
  tok.poison(), err.poison(), ttok.poison(), lp.poison(), tlp.poison();
  SamplerOutputs so{tok.get(), lp.get(), ttok.get(), tlp.get(), err.get()};
  CK(sample(plan, dl.get(), V, n_sample, dr.get(), n_rows, so, ws.get(), 0));
  CK(cudaDeviceSynchronize());
  const std::vector<int32_t> ht = tok.all(), he = err.all(), htt = ttok.all();
  const std::vector<float> hl = lp.all(), htl = tlp.all();
  auto lp_err = [](float a, float b) { return a == b ? 0.0 : std::fabs((double)a - b); };  // -inf == -inf
  for (int r = 0; r < n_rows; ++r) {
    if (rows[r].logits_row < 0 || want_bad[r]) continue;
    const RefSample ref = ref_sample(&want[(size_t)r * V], n_sample, rows[r], {}, rows[r].rules != 0);
    bool ok = he[r] == 0 && ref.err == 0;
    const bool tok_ok = ht[r] == ref.token;
    const bool allowed = ht[r] >= 0 && ht[r] < n_sample &&
                         (!rows[r].allow || ((rows[r].allow[ht[r] >> 5] >> (ht[r] & 31)) & 1u));
    std::string extra = allowed ? "" : "token refused by the mask ";
    ok = ok && allowed;
    double e = 0;
    if (tok_ok) {
      e = lp_err(hl[r], ref.logprob);
      for (int j = 0; j < (int)ref.top.size(); ++j) {
        if (htt[(size_t)r * kSamplerMaxProbs + j] != ref.top[j].first)
          ok = false, extra += fmt("top[%d] ", j);
        e = std::max(e, lp_err(htl[(size_t)r * kSamplerMaxProbs + j], ref.top[j].second));
      }
      ok = ok && e <= 1e-4;
    } else {
      extra += fmt("token gpu=%d ref=%d margin=%.1e", ht[r], ref.token, ref.margin);
      ok = ok && ref.margin < 1e-5;
    }
    report(ok, "sampler+rules", fmt("V=%d n=%d %s", V, n_sample, cs[r].name), e, 1e-4, extra.c_str());
  }
  CK(cudaFreeHost(h_mask));
  CK(cudaFreeHost(h_bias));
}

void run_logit_rules_tests(int V, int n_sample) {
  SamplerRow logits_only = row_params(0.8f, 40, 1.0f, 0.0f, 0);
  logits_only.logits_row = -1;
  test_logit_rules(
      V, n_sample,
      {{"greedy, mask of 1 token, n_probs=5", 1, false, false, row_params(0.0f, 0, 1.0f, 0.0f, 5)},
       {"greedy, mask and bias", n_sample / 20 + 1, true, false, row_params(0.0f, 0, 1.0f, 0.0f, 3)},
       {"top_k=40, mask of 3 tokens", 3, false, false, row_params(0.8f, 40, 1.0f, 0.0f, 5)},
       {"top_k=40 top_p=0.9, mask and bias", n_sample / 10 + 1, true, false,
        row_params(0.8f, 40, 0.9f, 0.0f, 3)},
       {"top_k=0 min_p=0.05, bias", 0, true, false, row_params(1.0f, 0, 1.0f, 0.05f, 3)},
       {"top_k=0 top_p=1, mask of half", n_sample / 2 + 1, false, false, row_params(1.0f, 0, 1.0f, 0.0f, 3)},
       {"top_k=0 top_p=0.9 T=2, mask of 5 tokens", 5, true, false, row_params(2.0f, 0, 0.9f, 0.0f, 3)},
       {"no rules", 0, false, false, row_params(0.8f, 40, 1.0f, 0.0f, 2)},
       {"NaN at a refused token: flagged", n_sample / 10 + 1, false, true,
        row_params(0.8f, 40, 1.0f, 0.0f, 0)},
       {"logits row (not sampled), mask and bias", n_sample / 10 + 1, true, false, logits_only}});
}

// =====================================================================================================
// graph capture: a decode-like sequence captured once, replayed, compared with direct launches (the
// kernels are deterministic, so the results must be bit-identical).

void test_graph() {
  const int n = 4, dim = 256, n_heads = 8, n_kv = 2, hd = 32, ctx = 700, V = 5000, rows = 512;
  std::vector<double> dummy;
  auto wq = encode(GgmlType::BF16, randu((size_t)n_heads * hd * dim, -0.1f, 0.1f), &dummy);
  auto wo = encode(GgmlType::F16, randu((size_t)V * dim, -0.1f, 0.1f), &dummy);
  auto wbig = encode(GgmlType::BF16, randu((size_t)rows * dim, -0.1f, 0.1f), &dummy);
  DevBuf<uint8_t> dwq(wq.size()), dwo(wo.size()), dwb(wbig.size());
  dwq.put(wq);
  dwo.put(wo);
  dwb.put(wbig);
  auto x = randn((size_t)64 * dim), nw = randu(dim, 0.5f, 1.5f);
  DevBuf<float> dx(x.size()), dnw(dim), dh((size_t)64 * dim), dq((size_t)n * n_heads * hd), dattn(dq.size()),
      dl((size_t)n * V), dbig((size_t)64 * rows);
  dx.put(x);
  dnw.put(nw);
  std::vector<double> kd;
  const size_t ce = (size_t)2 * n_kv * ctx * hd;
  auto kb = encode(GgmlType::F16, randn(ce), &kd), vb = encode(GgmlType::F16, randn(ce), &kd);
  DevBuf<uint8_t> dk(kb.size()), dv(vb.size());
  dk.put(kb);
  dv.put(vb);
  KvLayerView kv{GgmlType::F16, dk.get(), dv.get(), 2, n_kv, ctx, hd};
  std::vector<int32_t> pos = {650, 3, 699, 100}, seq = {0, 1, 1, -1};
  DevBuf<int32_t> dpos(n), dseq(n);
  dpos.put(pos);
  dseq.put(seq);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, (float)(2 * i) / hd);
  DevBuf<float> dinv(inv.size());
  dinv.put(inv);
  const AttentionPlan ap = plan_attention(g_dev, kv, n_heads, n, 5);
  DevBuf<uint8_t> aws(ap.workspace_bytes);
  DevBuf<uint8_t> mws(CudaMatmul::workspace_bytes(64, dim));
  CudaMatmul mm;
  CK(mm.init(mws.get(), mws.size()));
  SamplerPlan sp;
  CK(plan_sampler(g_dev, n, V, 64, &sp));
  DevBuf<uint8_t> sws(sp.workspace_bytes);
  CK(sampler_workspace_init(sp, sws.get(), 0));
  std::vector<SamplerRow> srows(n);
  for (int r = 0; r < n; ++r) {
    srows[r] = row_params(r == 0 ? 0.0f : 0.9f, 40, 0.95f, 0.05f, 4);
    srows[r].hist = nullptr;
    srows[r].n_hist = 0;
    srows[r].logits_row = r;
  }
  DevBuf<SamplerRow> dsr(n);
  dsr.put(srows);
  DevBuf<int32_t> stok(n), serr(n), sttok((size_t)n * kSamplerMaxProbs);
  DevBuf<float> slp(n), stlp((size_t)n * kSamplerMaxProbs);
  SamplerOutputs so{stok.get(), slp.get(), sttok.get(), stlp.get(), serr.get()};
  WeightView Wq{GgmlType::BF16, dwq.get(), n_heads * hd, dim, (size_t)dim * 2};
  WeightView Wo{GgmlType::F16, dwo.get(), V, dim, (size_t)dim * 2};
  WeightView Wb{GgmlType::BF16, dwb.get(), rows, dim, (size_t)dim * 2};

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto step = [&]() -> cudaError_t {
    cudaError_t e;
    if ((e = rmsnorm(dx.get(), dnw.get(), 64, dim, 1e-5f, dh.get(), st))) return e;
    if ((e = mm.matmul(Wb, dh.get(), 64, dbig.get(), nullptr, false, st)))
      return e;  // cuBLASLt inside the graph
    if ((e = gemv(Wq, dh.get(), n, dq.get(), nullptr, false, st))) return e;
    if ((e = rope(dq.get(), n_heads, nullptr, 0, n, hd, dpos.get(), dinv.get(), false, st))) return e;
    if ((e = attention(ap, kv, dq.get(), n, dpos.get(), dseq.get(), 0.17f, dattn.get(), aws.get(), st)))
      return e;
    if ((e = gemv(Wo, dh.get(), n, dl.get(), nullptr, false, st))) return e;
    return sample(sp, dl.get(), V, V, dsr.get(), n, so, sws.get(), st);
  };
  // warm-up run (creates the cuBLASLt plan on the host), then the direct reference results
  CK(step());
  CK(cudaStreamSynchronize(st));
  auto ref_big = dbig.all(), ref_attn = dattn.all(), ref_l = dl.all();
  auto ref_tok = stok.all();
  dbig.poison(), dattn.poison(), dl.poison(), stok.poison();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  const cudaError_t ce0 = step();
  const cudaError_t ce1 = cudaStreamEndCapture(st, &graph);
  if (ce0 != cudaSuccess || ce1 != cudaSuccess) {
    report(false, "graph", "capture of rmsnorm, cuBLASLt matmul, gemv, rope, attention, gemv, sampler", NAN,
           0, fmt("%s / %s", cudaGetErrorString(ce0), cudaGetErrorString(ce1)).c_str());
    return;
  }
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  const bool same =
      dbig.all() == ref_big && dattn.all() == ref_attn && dl.all() == ref_l && stok.all() == ref_tok;
  report(same, "graph", "capture + 3 replays == direct launches (bit-identical)", same ? 0 : 1, 0);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  uint64_t seed = 1234;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--filter" && i + 1 < argc) {
      g_filter = argv[++i];
    } else if (a == "--quick") {
      g_quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR] [--seed N] [--filter SUBSTRING] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (const int skip = skip_without_device()) return skip;
  if (!out_dir.empty() && !(g_log = open_log(out_dir, "test_cuda_kernels.txt"))) return 2;
  g_before_fatal = summary_on_fatal;
  CK(query_device(0, &g_dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  say("device: %s, sm_%d%d, %d SMs, L2 %zu MB, smem opt-in %zu KB; seed %llu\n", prop.name, prop.major,
      prop.minor, g_dev.n_sms, g_dev.l2_bytes >> 20, g_dev.smem_optin_bytes >> 10, (unsigned long long)seed);
  g_rng.seed(seed);

  if (enabled("embed"))
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      test_embed(t, 1000, 64, 1);
      test_embed(t, 1000, 257, 33);
    }
  if (enabled("rmsnorm"))
    for (auto [n, d] : std::vector<std::pair<int, int>>{{1, 64}, {3, 257}, {100, 4096}, {1, 8192}})
      test_rmsnorm(n, d);
  if (enabled("elementwise"))
    for (auto [c, o] : std::vector<std::pair<int64_t, int>>{{1, 0}, {1000, 0}, {4097, 1}, {1 << 20, 0}})
      test_elementwise(c, o);
  if (enabled("gather")) {
    test_gather(10, 1, 64);
    test_gather(100, 33, 4097);
  }
  if (enabled("convert"))
    for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) test_convert(t, 100003);
  if (enabled("rope"))
    for (int hd : {64, 80, 128})
      for (bool il : {false, true}) {
        test_rope(1, 32, 8, hd, il, true);
        test_rope(3, 4, 4, hd, il, false);
        test_rope(33, 8, 2, hd, il, true);
      }
  if (enabled("kv_write"))
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      test_kv_write(t, 1, 2, 2, 64, 64);
      test_kv_write(t, 17, 3, 4, 100, 80);
    }
  if (enabled("rope_kv_write"))
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
      for (bool il : {false, true}) {
        test_rope_kv(t, 1, 32, 8, 128, il);
        test_rope_kv(t, 9, 12, 4, 80, il);
        test_rope_kv(t, 4, 8, 8, 64, il);
      }
  if (enabled("gemv_fused"))
    for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
      // Llama-3 8B's and 1B's qkv / gate_up / down / LM head widths, odd sizes (the rmsnorm replay with
      // 1..4 float4 per virtual thread and partial virtual warps), zero and absent row pointers.
      test_gemv_fused_input(t, 6144, 4096, false, 1, false, false);
      test_gemv_fused_input(t, 1000, 2048, false, 2, true, false);
      test_gemv_fused_input(t, 333, 16384, false, 0, false, true);
      test_gemv_fused_input(t, 129, 5128, false, -1, true, false);
      test_gemv_fused_input(t, 700, 1032, false, -2, false, true);
      test_gemv_fused_input(t, 200, 12296, false, 2, false, false);
      test_gemv_fused_input(t, 4096, 14336, true, 0, false, true);
      test_gemv_fused_input(t, 517, 1032, true, 0, false, false);
      test_gemv_fused_input(t, 64, 8, true, 0, false, true);
      test_gemv_fused_input(t, 64, 8, false, 0, false, true);
    }

  if (enabled("gemv")) {
    struct S {
      int64_t rows, cols;
    };
    const std::vector<S> shapes =
        g_quick ? std::vector<S>{{100, 136}, {257, 1024}}
                : std::vector<S>{{64, 64}, {100, 136}, {257, 1024}, {1000, 4096}, {33, 77}};
    const std::vector<int> ns =
        g_quick ? std::vector<int>{1, 9, 32} : std::vector<int>{1, 3, 8, 9, 16, 17, 32};
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
      for (const S& s : shapes)
        for (int n : ns) {
          const bool bias = (n % 2) == 1, acc = n == 3 || n == 17 || n == 32;
          test_gemv(t, s.rows, s.cols, n, bias, acc, GemvPath::automatic);
          if (s.cols % 8 == 0 && (n == 1 || n == 17))
            test_gemv(t, s.rows, s.cols, n, bias, acc, GemvPath::simt);
        }
    test_gemv(GgmlType::BF16, 70, 264, 5, true, false, GemvPath::tensor_core, 16);  // padded rows
    // the column-split kernel's two launch modes at every n (default: programmatic + L2 at n = 1, else L1)
    for (int mode : {0, 1}) {
      (mode ? tuning::set_gemv_l1_all : tuning::set_gemv_l2_all)(true);
      for (GgmlType t : {GgmlType::F16, GgmlType::BF16})
        for (int n : {1, 5, 12, 32}) test_gemv(t, 1000, 1024, n, n == 5, n != 5, GemvPath::tensor_core);
      (mode ? tuning::set_gemv_l1_all : tuning::set_gemv_l2_all)(false);
    }
    test_gemv(GgmlType::F16, 4096, 4096, 1, false, true, GemvPath::tensor_core);
    // the automatic choice for tall BF16 matrices: the split-K kernel (ring 8 for n <= 4; no L2 prefetch
    // for 9 <= n <= 16 on >= 65536 rows)
    // (one row goes to the weight-streaming kernel: its split-K ring-8 configuration chosen explicitly)
    test_gemv(GgmlType::BF16, 8192 + 37, 1024, 4, false, true, GemvPath::automatic);
    {
      tuning::GemvTuning t;
      t.kernel = 2;
      t.config = 1;
      tuning::set_gemv_tuning(t);
      test_gemv(GgmlType::BF16, 8192 + 37, 1024, 1, true, false, GemvPath::automatic);
      tuning::set_gemv_tuning({});
    }
    test_gemv(GgmlType::BF16, 65536 + 5, 256, 12, true, true, GemvPath::automatic);
    // every variant of the split-K kernel the benchmark can select (tuning.h): MMA flavour x block shape x
    // split-K, and a tiny shared-memory budget that stages x in many sub-slices
    for (int mma : {1, 2})
      for (int cfg = 0; cfg < tuning::gemv_config_count(); ++cfg)
        for (int ks : {0, 1, 2, 8})
          for (int budget : {0, 4096}) {
            if (g_quick && (ks == 2 || budget != 0)) continue;
            tuning::GemvTuning t;
            t.kernel = 2, t.mma = mma, t.config = cfg, t.splits = ks, t.smem_budget = budget;
            tuning::set_gemv_tuning(t);
            const std::string v = fmt("[mma %d cfg %d ks %d budget %d]", mma, cfg, ks, budget);
            say("     variant %s\n", v.c_str());
            for (int n : {1, 9, 32}) {
              test_gemv(GgmlType::BF16, 130, 4096, n, n != 9, n == 9, GemvPath::tensor_core);
              test_gemv(GgmlType::BF16, 257, 1000, n, false, false, GemvPath::tensor_core);
            }
          }
    for (int trig : {1, 2}) {  // trigger at the start / after the loads; without the L2 prefetch
      tuning::GemvTuning t;
      t.kernel = 2, t.trigger = trig, t.pf_steps = trig == 1 ? -1 : 0;
      tuning::set_gemv_tuning(t);
      for (int n : {1, 8, 17}) test_gemv(GgmlType::BF16, 1000, 4096, n, true, n == 8, GemvPath::automatic);
    }
    tuning::set_gemv_tuning({});
    // the weight-streaming kernel (n = 1, F16 / BF16; anything else falls back): odd shapes, padded rows,
    // budgets from one slot per warp to the most, rows of one to four segments
    for (int budget : {0, 96 << 10, 20 << 10}) {
      if (g_quick && budget == (20 << 10)) continue;
      tuning::GemvTuning t;
      t.kernel = 3, t.smem_budget = budget;
      tuning::set_gemv_tuning(t);
      say("     variant [stream budget %d]\n", budget);
      for (GgmlType ty : {GgmlType::BF16, GgmlType::F16}) {
        test_gemv(ty, 257, 1000, 1, true, false, GemvPath::automatic);
        test_gemv(ty, 3, 64, 1, false, true, GemvPath::automatic);
        test_gemv(ty, 4096 + 3, 4096, 1, true, true, GemvPath::automatic);
        test_gemv(ty, 1000, 14336, 1, false, true, GemvPath::automatic);
        test_gemv(ty, 70, 264, 1, true, false, GemvPath::automatic, 16);  // padded rows
        if (!g_quick)
          for (int cols : {2048, 6144, 10240, 11008, 12288, 16384})
            test_gemv(ty, 300, cols, 1, true, true, GemvPath::automatic);
      }
      test_gemv(GgmlType::F32, 257, 1000, 1, true, false, GemvPath::automatic);   // falls back
      test_gemv(GgmlType::BF16, 257, 1000, 3, true, false, GemvPath::automatic);  // n = 3: falls back
      test_gemv(GgmlType::BF16, 64, 16392, 1, true, false, GemvPath::automatic);  // too wide: falls back
    }
    tuning::set_gemv_tuning({});
    tuning::GemvTuning old;
    old.kernel = 1;
    tuning::set_gemv_tuning(old);
    for (int n : {1, 9, 32}) test_gemv(GgmlType::BF16, 257, 1024, n, true, false, GemvPath::tensor_core);
    tuning::set_gemv_tuning({});
    // the split-K kernel (and F16 / F32 weights through it) launched the ordinary way
    set_programmatic_launch(false);
    {
      tuning::GemvTuning t;
      t.kernel = 2;
      tuning::set_gemv_tuning(t);
      for (GgmlType ty : {GgmlType::BF16, GgmlType::F16, GgmlType::F32})
        test_gemv(ty, 1000, 4096, 8, true, true, GemvPath::automatic);
      tuning::set_gemv_tuning({});
    }
    set_programmatic_launch(true);
    {  // F16 / F32 weights through the split-K kernel, with programmatic launch
      tuning::GemvTuning t;
      t.kernel = 2;
      tuning::set_gemv_tuning(t);
      for (GgmlType ty : {GgmlType::F16, GgmlType::F32})
        for (int n : {1, 9, 32}) test_gemv(ty, 257, 1000, n, n == 9, n == 1, GemvPath::automatic);
      tuning::set_gemv_tuning({});
    }
  }
  if (enabled("matmul")) {
    DevBuf<uint8_t> ws(CudaMatmul::workspace_bytes(300, 4096));
    CudaMatmul mm;
    CK(mm.init(ws.get(), ws.size()));
    for (GgmlType t : {GgmlType::BF16, GgmlType::F16, GgmlType::F32}) {
      test_matmul(mm, t, 256, 512, 33, false, false);
      test_matmul(mm, t, 1000, 4096, 100, true, false);
      test_matmul(mm, t, 300, 136, 257, true, true);
      test_matmul(mm, t, 128, 256, 32, true, true);  // gemv through the same entry
    }
  }
  run_lowbit_tests();  // lowbit_gemv, lowbit_matmul, lowbit_embed (each checks --filter)
  if (enabled("attention")) {
    const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
    for (GgmlType t : types) {
      for (int hd : {64, 80, 128, 256}) {
        test_attention({t, hd, 4, 4, {0}, {1}, 0});                           // context 1, MHA
        test_attention({t, hd, 8, 2, {16, 999, 5, 300}, {0, 1, -1, 2}, 0});   // GQA 4, padding
        if (!g_quick) test_attention({t, hd, 16, 2, {4096, 17}, {2, 0}, 0});  // GQA 8, long
      }
      test_attention({t, 128, 24, 2, {1000, 33, 2000}, {1, 0, 2}, 0});  // GQA 12: two head chunks
      test_attention({t, 128, 8, 1, {4096}, {0}, 1});                   // one split over 4097 positions
      test_attention({t, 64, 8, 8, {4096, 700}, {1, 2}, 7});            // forced 7 splits
      // Gemma: sliding windows (inside one tile, across tiles and splits, longer than the row) and
      // soft-capped scores (cap 50 as Gemma 2; 0.5 so that the cap bites on unit-variance scores)
      for (int w : {6, 100, 1000, 5000})
        for (float cap : {0.0f, 50.0f, 0.5f}) {
          AttnCase c{t, 64, 8, 2, {16, 999, 5, 300, 4095}, {0, 1, -1, 2, 1}, 0};
          c.window = w;
          c.softcap = cap;
          test_attention(c);
          c.n_heads = 16;  // GQA 8, 40 rows: the per-row kernel for a prefill-sized step, forced splits
          c.force_splits = 5;
          c.pos.clear();
          c.seq.clear();
          for (int i = 0; i < 40; ++i) c.pos.push_back(200 + i), c.seq.push_back(0);
          test_attention(c);
        }
    }
    // gpt-oss: sinks, full and sliding (window 128) layers, GQA 8 on head_dim 64, decode rows (one split and
    // several) and 16 / 32 / 40-row steps (the per-row kernel; 40 rows of a full layer with an F16 / BF16
    // cache: the tiled one), padding rows, forced splits; the tiled kernel forced for 16 rows
    for (GgmlType t : types)
      for (int w : {0, 128})
        for (int splits : {0, 1, 5}) {
          AttnCase c{t, 64, 16, 2, {16, 999, 5, 300, 4095}, {0, 1, -1, 2, 1}, splits};
          c.window = w;
          c.sinks = true;
          test_attention(c);
          for (int rows : {16, 32, 40}) {
            c.pos.clear();
            c.seq.clear();
            for (int i = 0; i < rows; ++i) c.pos.push_back(200 + i), c.seq.push_back(i % 7 == 6 ? -1 : 0);
            test_attention(c);
            if (rows == 16 && w == 0 && splits == 0) {
              c.mode = 2;
              test_attention(c);
              c.mode = 0;
            }
          }
        }
    // splits of at least 256 and 2048 positions (short rows in one split, written without the merge)
    for (int mc : {256, 2048}) {
      tuning::set_attention_min_chunk(mc);
      for (GgmlType t : types) {
        test_attention({t, 128, 8, 2, {16, 999, 5, 300}, {0, 1, -1, 2}, 0});
        test_attention({t, 64, 32, 8, {4096, 700, 12}, {1, 2, 0}, 0});
      }
    }
    tuning::set_attention_min_chunk(64);
    // without programmatic dependent launch (the default has it), and with the split kernel's other triggers
    tuning::set_attention_pdl(false);
    for (GgmlType t : types) test_attention({t, 128, 32, 8, {4096, 700, 12}, {1, 2, 0}, 0});
    tuning::set_attention_pdl(true);
    for (int trig : {0, 1}) {
      tuning::set_attention_trigger(trig);
      for (GgmlType t : types) test_attention({t, 128, 32, 8, {4096, 700, 12}, {1, 2, 0}, 0});
    }
    tuning::set_attention_trigger(2);
    // 9 consecutive rows of one sequence (a verification step's shape)
    {
      std::vector<int32_t> vp, vs;
      for (int i = 0; i < 9; ++i) vp.push_back(1000 + i), vs.push_back(2);
      for (GgmlType t : types) test_attention({t, 128, 32, 8, vp, vs, 0});
    }
    // one K/V tile in flight per block (the plan's split count follows)
    tuning::set_attention_stages(1);
    for (GgmlType t : types) {
      test_attention({t, 128, 8, 2, {16, 999, 5, 300}, {0, 1, -1, 2}, 0});
      test_attention({t, 80, 24, 2, {1000, 33, 2000}, {1, 0, 2}, 0});
    }
    tuning::set_attention_stages(0);
    // prefill rows: 100 consecutive positions of one sequence (plus one padding row), on the per-row kernel
    // and on the automatic choice (the tiled kernel for F16 / BF16, n >= kAttentionTiledMinRows)
    std::vector<int32_t> pos, seq;
    for (int i = 0; i < 100; ++i) pos.push_back(400 + i), seq.push_back(1);
    pos.push_back(0), seq.push_back(-1);
    for (GgmlType t : types)
      for (int mode : {1, 0}) test_attention({t, 128, 32, 8, pos, seq, 0, mode});
    // the automatic choice at its threshold: 32 rows per-row, 33 tiled
    for (int rows : {kAttentionTiledMinRows - 1, kAttentionTiledMinRows})
      test_attention({GgmlType::BF16, 64, 16, 4, std::vector<int32_t>(pos.begin(), pos.begin() + rows),
                      std::vector<int32_t>(seq.begin(), seq.begin() + rows), 0, 0});
    test_attention_tiled_cases();
  }
  if (enabled("sampler")) {
    run_sampler_tests(128256, 128256);
    if (!g_quick) {
      run_sampler_tests(1007, 1007);
      run_sampler_tests(32064, 32000);
    }
  }
  if (enabled("logit_rules")) {
    run_logit_rules_tests(4096, 4096);
    run_logit_rules_tests(128256, 128000);  // 4008 mask words: one chunk; n_sample below the rows' width
    if (!g_quick) run_logit_rules_tests(152064, 151936);  // two chunks of the mask in shared memory
  }
  if (enabled("graph")) test_graph();

  say("test_cuda_kernels: %d passed, %d failed\n", g_pass, g_fail);
  if (g_log) std::fclose(g_log);
  return g_fail ? 1 : 0;
}
