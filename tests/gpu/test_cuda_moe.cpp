// The mixture-of-experts kernels (backend/cuda/moe.h) against float64 references:
//   moe_route  router logits -> probabilities, the top k experts and their weights: the experts exactly as
//              the CPU's model/moe.h picks them from the same logits, probabilities and weights within
//              1e-6 relative of float64 softmax;
//   moe_ffn    x += sum_j w_j FFN_{e_j}(xn) for every weight type the kernels take (F32, F16, BF16, Q8_0 and
//              MXFP4 in their device layouts), expert counts 4..256, k 1..8, 1..130 rows (tiles of one and of
//              many pairs per expert), against float64 over the weights' exact f32 values; the bound is 1e-5
//              of the sum of the magnitudes of the terms (a wrong expert, row or weight is off by the
//              magnitude); rows whose ids include an out-of-range expert (skipped) and guard values past
//              every output; steps of more than 32 rows (BF16 tensor cores) by the relative L2 of the
//              experts' sum, 1e-2;
//   gpt-oss     moe_route_topk_softmax (ids exactly the CPU's, ties and NaN logits included; weights within
//              1e-6 relative), the router's bias, and moe_ffn with every expert's three biases and the
//              clamped SwiGLU (swiglu_oai, limit 7; biases large enough that the clamps bite) against the
//              same float64 reference with cpu::swiglu_oai's formula, decode and prefill paths.
// A self-check shows the comparison fails a wrong expert choice, and one that an ignored bias fails.
//
//   test_cuda_moe [--out DIR] [--bench | --bench-only]
// Exit 0 when all passed, 1 on a failure, 77 without a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemv_lowbit.h"
#include "backend/cuda/moe.h"
#include "core/dtype.h"
#include "core/quants.h"
#include "gpu_program.h"
#include "model/moe.h"

using namespace ultra;
using namespace ultra::test;

namespace {

int g_pass = 0, g_fail = 0;

constexpr float kGuard = 12345.0f;

// n_expert matrices [rows, cols] of one type in the device layout, back to back, and their exact values.
struct Experts {
  cuda::ExpertWeights w;
  std::vector<float> value;  // [n_expert, rows, cols]
  DevBuf<uint8_t> dev;
  std::vector<float> bias;  // [n_expert, rows] or empty
  DevBuf<float> dev_bias;
  // Gives the experts a bias of normal values times scale (w.bias points at its device copy).
  void add_bias(float scale, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, scale);
    bias.resize((size_t)w.n_expert * w.rows);
    for (float& v : bias) v = nd(rng);
    dev_bias = DevBuf<float>(bias);
    w.bias = dev_bias.get();
  }
  double b(int e, int r) const { return bias.empty() ? 0.0 : bias[(size_t)e * w.rows + r]; }
};

// One expert's GGUF blocks [rows, row_bytes] (Q8_0 or MXFP4) into the expert kernels' device layout at out.
void pack_expert(GgmlType t, const void* blocks, int rows, int cols, size_t row_bytes, uint8_t* out) {
  const WeightView v{.type = t, .data = blocks, .rows = rows, .cols = cols, .row_bytes = row_bytes};
  if (!(t == GgmlType::MXFP4 ? cuda::moe_pack_mxfp4_rows(v, 0, rows, out)
                             : cuda::lowbit_pack_rows(v, 0, rows, out))) {
    say("FAIL packing " + std::string(type_name(t)) + " experts\n");
    std::exit(1);
  }
}

Experts make_experts(GgmlType t, int n_expert, int rows, int cols, std::mt19937& rng) {
  Experts x;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt((float)cols));
  const size_t n = (size_t)n_expert * rows * cols;
  x.value.resize(n);
  std::vector<uint8_t> bytes;
  size_t row_bytes = 0;
  if (t == GgmlType::MXFP4) {  // random codes, exponents around 1 / sqrt(cols) (0.5 * 2^(e - 127) * code)
    row_bytes = cuda::moe_mxfp4_row_bytes(cols);
    const int nb = cols / 32;
    std::vector<BlockMXFP4> blocks((size_t)rows * nb);
    std::uniform_int_distribution<int> code(0, 15), ex(-2, 1);
    const int e0 = 127 - (int)std::lround(std::log2(std::sqrt((float)cols))) - 2;
    bytes.resize((size_t)n_expert * rows * row_bytes);
    for (int e = 0; e < n_expert; ++e) {
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nb; ++b) {
          BlockMXFP4& blk = blocks[(size_t)r * nb + b];
          blk.e = (uint8_t)(e0 + ex(rng));
          for (int j = 0; j < 16; ++j) blk.qs[j] = (uint8_t)(code(rng) | (code(rng) << 4));
          dequant_block(blk, &x.value[((size_t)e * rows + r) * cols + b * 32]);
        }
      pack_expert(t, blocks.data(), rows, cols, (size_t)nb * sizeof(BlockMXFP4),
                  bytes.data() + (size_t)e * rows * row_bytes);
    }
  } else if (t == GgmlType::Q8_0) {
    row_bytes = cuda::lowbit_row_bytes(t, cols);
    const int nb = cols / kQ8_0Block;
    std::vector<BlockQ8_0> blocks((size_t)rows * nb);
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> sd(0.5f, 2.0f);
    bytes.resize((size_t)n_expert * rows * row_bytes);
    for (int e = 0; e < n_expert; ++e) {
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nb; ++b) {
          BlockQ8_0& blk = blocks[(size_t)r * nb + b];
          blk.d = fp32_to_fp16(sd(rng) / 127.0f / std::sqrt((float)cols));
          for (int i = 0; i < kQ8_0Block; ++i) {
            blk.qs[i] = (int8_t)code(rng);
            x.value[((size_t)e * rows + r) * cols + b * kQ8_0Block + i] =
                (float)blk.qs[i] * fp16_to_fp32(blk.d);
          }
        }
      pack_expert(t, blocks.data(), rows, cols, (size_t)nb * sizeof(BlockQ8_0),
                  bytes.data() + (size_t)e * rows * row_bytes);
    }
  } else {
    const size_t eb = t == GgmlType::F32 ? 4 : 2;
    row_bytes = cols * eb;
    bytes.resize(n * eb);
    for (size_t i = 0; i < n; ++i) {
      const float f = nd(rng);
      if (t == GgmlType::F32) {
        std::memcpy(bytes.data() + 4 * i, &f, 4);
        x.value[i] = f;
      } else {
        const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
        x.value[i] = t == GgmlType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
    }
  }
  x.dev = DevBuf<uint8_t>(bytes);
  x.w.type = t;
  x.w.data = x.dev.get();
  x.w.rows = rows;
  x.w.cols = cols;
  x.w.row_bytes = row_bytes;
  x.w.expert_bytes = row_bytes * rows;
  x.w.n_expert = n_expert;
  return x;
}

struct Case {
  GgmlType type;
  int n_expert, k, dim, ffn, n;
  bool bad_id = false;     // row 0's last slot names no expert (skipped)
  bool via_route = false;  // one row: ids and weights from moe_route, which also makes the decode tiles
  bool oai = false;        // gpt-oss: biased experts, swiglu_oai (limit 7), routed by moe_route_topk_softmax
};

constexpr float kOaiLimit = 7.0f;

// cpu::swiglu_oai's formula in float64.
double swiglu_oai_ref(double g, double u, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1.0) * (g / (1.0 + std::exp(-(g * cpu::kSwigluOaiAlpha))));
}

std::string case_name(const Case& c) {
  char b[160];
  std::snprintf(b, sizeof b, "%s E=%d k=%d dim=%d ffn=%d n=%d%s", std::string(type_name(c.type)).c_str(),
                c.n_expert, c.k, c.dim, c.ffn, c.n,
                c.bad_id      ? " (an out-of-range id)"
                : c.via_route ? " (routed: the decode kernels)"
                              : "");
  if (c.oai) std::strncat(b, " gpt-oss (biases, swiglu_oai)", sizeof b - std::strlen(b) - 1);
  return b;
}

void result(bool ok, const std::string& what, const std::string& detail) {
  (ok ? g_pass : g_fail)++;
  say((ok ? "PASS " : "FAIL ") + what + (detail.empty() ? "" : ": " + detail) + "\n");
}

// moe_route on random logits: ids equal to the CPU's, probabilities and weights within 1e-6 relative of
// float64.
void check_route(int n_expert, int k, bool norm, int n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits((size_t)n * n_expert);
  for (float& v : logits) v = nd(rng);
  DevBuf<float> d_logits(logits);
  DevBuf<int32_t> d_ids(std::vector<int32_t>((size_t)n * k + kTail, -7));
  DevBuf<float> d_w(std::vector<float>((size_t)n * k + kTail, kGuard));
  CK(cuda::moe_route(d_logits.get(), n, n_expert, k, norm, d_ids.get(), d_w.get(), nullptr));
  CK(cudaDeviceSynchronize());
  const auto p = d_logits.all(logits.size());
  const auto ids = d_ids.all((size_t)n * k + kTail);
  const auto w = d_w.all((size_t)n * k + kTail);
  std::vector<float> cpu_logits = logits, cpu_w((size_t)n * k);
  std::vector<int32_t> cpu_ids((size_t)n * k);
  moe_route(cpu_logits.data(), n, n_expert, k, norm, cpu_ids.data(), cpu_w.data());
  int bad = 0;
  std::string detail;
  auto miss = [&](const std::string& s) {
    if (++bad <= 3) detail += (detail.empty() ? "" : "; ") + s;
  };
  for (int r = 0; r < n; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < n_expert; ++e) mx = std::max(mx, (double)logits[(size_t)r * n_expert + e]);
    for (int e = 0; e < n_expert; ++e) sum += std::exp((double)logits[(size_t)r * n_expert + e] - mx);
    double tot = 0;
    for (int j = 0; j < k; ++j) {
      const int e = cpu_ids[(size_t)r * k + j];
      tot += std::exp((double)logits[(size_t)r * n_expert + e] - mx) / sum;
    }
    for (int e = 0; e < n_expert; ++e) {
      const double want = std::exp((double)logits[(size_t)r * n_expert + e] - mx) / sum;
      if (std::fabs(p[(size_t)r * n_expert + e] - want) > 1e-6 * want + 1e-12)
        miss("p[" + std::to_string(r) + "," + std::to_string(e) + "]");
    }
    for (int j = 0; j < k; ++j) {
      const int e = cpu_ids[(size_t)r * k + j];
      if (ids[(size_t)r * k + j] != e) miss("ids[" + std::to_string(r) + "," + std::to_string(j) + "]");
      double want = std::exp((double)logits[(size_t)r * n_expert + e] - mx) / sum;
      if (norm) want /= std::max(tot, 6.103515625e-5);
      if (std::fabs(w[(size_t)r * k + j] - want) > 1e-6 * want + 1e-12)
        miss("w[" + std::to_string(r) + "," + std::to_string(j) + "]");
    }
  }
  for (size_t i = (size_t)n * k; i < ids.size(); ++i)
    if (ids[i] != -7 || w[i] != kGuard) miss("written past the end");
  char name[96];
  std::snprintf(name, sizeof name, "moe_route E=%d k=%d norm=%d n=%d", n_expert, k, norm, n);
  result(bad == 0, name, detail);
}

// moe_route_topk_softmax on random logits (ties: values on a grid of 0.25; nan_rows: a NaN in every third
// row): ids equal to the CPU's, weights within 1e-6 relative of the CPU's, logits untouched.
void check_route_topk_softmax(int n_expert, int k, int n, bool ties, bool nans, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits((size_t)n * n_expert);
  for (float& v : logits) v = ties ? std::round(4.0f * nd(rng)) / 4.0f : nd(rng);
  if (nans)
    for (int r = 0; r < n; r += 3) logits[(size_t)r * n_expert + (size_t)(r % n_expert)] = NAN;
  DevBuf<float> d_logits(logits);
  DevBuf<int32_t> d_ids(std::vector<int32_t>((size_t)n * k + kTail, -7));
  DevBuf<float> d_w(std::vector<float>((size_t)n * k + kTail, kGuard));
  CK(cuda::moe_route_topk_softmax(d_logits.get(), n, n_expert, k, d_ids.get(), d_w.get(), nullptr));
  CK(cudaDeviceSynchronize());
  const auto after = d_logits.all(logits.size());
  const auto ids = d_ids.all((size_t)n * k + kTail);
  const auto w = d_w.all((size_t)n * k + kTail);
  std::vector<float> cpu_w((size_t)n * k);
  std::vector<int32_t> cpu_ids((size_t)n * k);
  moe_route_topk_softmax(logits.data(), n, n_expert, k, cpu_ids.data(), cpu_w.data());
  int bad = 0;
  std::string detail;
  auto miss = [&](const std::string& s) {
    if (++bad <= 3) detail += (detail.empty() ? "" : "; ") + s;
  };
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::memcmp(&after[i], &logits[i], 4) != 0) miss("logits changed");
  for (int i = 0; i < n * k; ++i) {
    if (ids[i] != cpu_ids[i])
      miss("ids[" + std::to_string(i) + "]=" + std::to_string(ids[i]) + " cpu " + std::to_string(cpu_ids[i]));
    if (!(std::fabs(w[i] - cpu_w[i]) <= 1e-6 * std::fabs(cpu_w[i])) &&
        !(std::isnan(w[i]) && std::isnan(cpu_w[i])))
      miss("w[" + std::to_string(i) + "]");
  }
  for (size_t i = (size_t)n * k; i < ids.size(); ++i)
    if (ids[i] != -7 || w[i] != kGuard) miss("written past the end");
  char name[128];
  std::snprintf(name, sizeof name, "moe_route_topk_softmax E=%d k=%d n=%d%s%s", n_expert, k, n,
                ties ? " ties" : "", nans ? " NaN logits" : "");
  result(bad == 0, name, detail);
}

// Runs moe_ffn on a case; returns the number of elements outside the bound. corrupt: the reference uses
// the next expert for every pair (the self-check); drop_bias: the kernel is given the down projection
// without its bias, the reference with it (the self-check of the biases).
int run_ffn(const Case& c, std::mt19937& rng, std::string& detail, bool corrupt = false,
            bool drop_bias = false) {
  Experts gate = make_experts(c.type, c.n_expert, c.ffn, c.dim, rng);
  Experts up = make_experts(c.type, c.n_expert, c.ffn, c.dim, rng);
  Experts down = make_experts(c.type, c.n_expert, c.dim, c.ffn, rng);
  const double limit = c.oai ? kOaiLimit : 0.0;
  if (c.oai) {  // large enough that some gate / up values pass the limit
    gate.add_bias(4.0f, rng);
    up.add_bias(4.0f, rng);
    down.add_bias(1.0f, rng);
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xn((size_t)c.n * c.dim), x0((size_t)c.n * c.dim);
  for (float& v : xn) v = nd(rng);
  for (float& v : x0) v = nd(rng);
  // Distinct experts per row (as the router picks), weights in (0, 1).
  std::vector<int32_t> ids((size_t)c.n * c.k);
  std::vector<float> w((size_t)c.n * c.k);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  std::vector<int> perm(c.n_expert);
  for (int r = 0; r < c.n; ++r) {
    for (int e = 0; e < c.n_expert; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < c.k; ++j) ids[(size_t)r * c.k + j] = perm[j], w[(size_t)r * c.k + j] = ud(rng);
  }
  if (c.bad_id) ids[(size_t)c.k - 1] = c.n_expert;  // out of range: that slot adds nothing
  DevBuf<float> d_xn(xn);
  std::vector<float> xg = x0;
  xg.resize(x0.size() + kTail, kGuard);
  DevBuf<float> d_x(xg);
  DevBuf<int32_t> d_ids(ids);
  DevBuf<float> d_w(w);
  DevBuf<uint8_t> ws(cuda::moe_scratch_bytes(c.n, c.k, c.n_expert, c.ffn, c.dim));
  const cuda::MoeScratch s = cuda::moe_scratch(ws.get(), c.n, c.k, c.n_expert, c.ffn, c.dim);
  if (c.via_route) {  // router logits -> ids, w and the tiles, on the device
    std::vector<float> logits((size_t)c.n * c.n_expert);
    for (float& v : logits) v = 2.0f * nd(rng);
    DevBuf<float> d_logits(logits);
    if (c.oai)
      CK(cuda::moe_route_topk_softmax(d_logits.get(), c.n, c.n_expert, c.k, d_ids.get(), d_w.get(), nullptr,
                                      &s));
    else
      CK(cuda::moe_route(d_logits.get(), c.n, c.n_expert, c.k, true, d_ids.get(), d_w.get(), nullptr, &s));
    CK(cudaDeviceSynchronize());
    ids = d_ids.all(ids.size());
    w = d_w.all(w.size());
  }
  cuda::ExpertWeights down_w = down.w;
  if (drop_bias) down_w.bias = nullptr;
  const cudaError_t e = cuda::moe_ffn(gate.w, up.w, down_w, d_xn.get(), c.n, d_ids.get(), d_w.get(), c.k,
                                      d_x.get(), s, nullptr, c.via_route, (float)limit);
  int bad = 0;
  if (e != cudaSuccess) {
    detail = std::string("launch: ") + cudaGetErrorString(e);
    bad = 1;
  } else {
    CK(cudaDeviceSynchronize());
    const auto y = d_x.all(xg.size());
    std::vector<double> h(c.ffn), ha(c.ffn);
    double l2_err = 0, l2_ref = 0;
    for (int r = 0; r < c.n && bad < 1000; ++r) {
      std::vector<double> want(c.dim), mag(c.dim);
      for (int d = 0; d < c.dim; ++d) want[d] = x0[(size_t)r * c.dim + d], mag[d] = std::fabs(want[d]);
      for (int j = 0; j < c.k; ++j) {
        int ex = ids[(size_t)r * c.k + j];
        if (ex >= c.n_expert) continue;
        if (corrupt) ex = (ex + 1) % c.n_expert;
        const double wj = w[(size_t)r * c.k + j];
        for (int f = 0; f < c.ffn; ++f) {
          double g = 0, u = 0, ga = 0, ua = 0;
          const float* gr = &gate.value[((size_t)ex * c.ffn + f) * c.dim];
          const float* ur = &up.value[((size_t)ex * c.ffn + f) * c.dim];
          for (int d = 0; d < c.dim; ++d) {
            const double xv = xn[(size_t)r * c.dim + d];
            g += gr[d] * xv, u += ur[d] * xv;
            ga += std::fabs(gr[d] * xv), ua += std::fabs(ur[d] * xv);
          }
          if (limit > 0) {  // a bound on the magnitude of h's terms: the activation's slope is below 1.1
            g += gate.b(ex, f), u += up.b(ex, f);
            ga += std::fabs(gate.b(ex, f)), ua += std::fabs(up.b(ex, f));
            h[f] = swiglu_oai_ref(g, u, limit);
            ha[f] = 1.1 * (ga + std::fabs(g)) * (std::min(std::fabs(u), limit) + 1.0 + ua);
            continue;
          }
          const double sg = g / (1.0 + std::exp(-g));
          h[f] = sg * u;
          ha[f] = (std::fabs(sg) + ga) * (std::fabs(u) + ua);  // a bound on the magnitude of h's terms
        }
        for (int d = 0; d < c.dim; ++d) {
          const float* dr = &down.value[((size_t)ex * c.dim + d) * c.ffn];
          double yv = down.b(ex, d), ya = std::fabs(down.b(ex, d));
          for (int f = 0; f < c.ffn; ++f) yv += dr[f] * h[f], ya += std::fabs(dr[f]) * ha[f];
          want[d] += wj * yv;
          mag[d] += wj * ya;
        }
      }
      for (int d = 0; d < c.dim; ++d) {
        const double got = y[(size_t)r * c.dim + d], bound = 1e-5 * mag[d] + 1e-6;
        const double delta = want[d] - x0[(size_t)r * c.dim + d];
        l2_err += (got - want[d]) * (got - want[d]), l2_ref += delta * delta;
        if (c.n > cuda::kMoeExactMaxRows) continue;  // BF16 tensor cores: the relative L2 below
        if (!(std::fabs(got - want[d]) <= bound) && ++bad <= 3) {
          char b[160];
          std::snprintf(b, sizeof b, "%sx[%d,%d]=%.8g want %.8g bound %.3g", detail.empty() ? "" : "; ", r, d,
                        got, want[d], bound);
          detail += b;
        }
      }
    }
    if (c.n > cuda::kMoeExactMaxRows) {  // both operands rounded to BF16 (2^-9 relative each)
      const double rel = std::sqrt(l2_err / l2_ref);
      char b[96];
      std::snprintf(b, sizeof b, "relative L2 of the experts' sum %.3g (bound 1e-2)", rel);
      detail += b;
      if (!(rel <= 1e-2)) ++bad;
    }
    for (size_t i = x0.size(); i < y.size(); ++i)
      if (y[i] != kGuard) {
        ++bad;
        detail += "; written past the end";
        break;
      }
  }
  return bad;
}

// moe_router: logits [n, E] = x [n, dim] . R^T (+ bias) in f32 against float64, bound 1e-5 of the terms'
// magnitude.
void check_router(GgmlType t, int n_expert, int dim, int n, std::mt19937& rng, bool bias = false) {
  Experts r = make_experts(t, 1, n_expert, dim, rng);
  if (bias) r.add_bias(1.0f, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)n * dim);
  for (float& v : x) v = nd(rng);
  DevBuf<float> d_x(x);
  DevBuf<float> d_out(std::vector<float>((size_t)n * n_expert + kTail, kGuard));
  CK(cuda::moe_router(r.w, d_x.get(), n, d_out.get(), nullptr));
  CK(cudaDeviceSynchronize());
  const auto y = d_out.all((size_t)n * n_expert + kTail);
  int bad = 0;
  std::string detail;
  for (int i = 0; i < n; ++i)
    for (int e = 0; e < n_expert; ++e) {
      double want = r.b(0, e), mag = std::fabs(want);
      for (int d = 0; d < dim; ++d) {
        const double term = (double)r.value[(size_t)e * dim + d] * x[(size_t)i * dim + d];
        want += term, mag += std::fabs(term);
      }
      const double got = y[(size_t)i * n_expert + e];
      if (!(std::fabs(got - want) <= 1e-5 * mag + 1e-7) && ++bad <= 3)
        detail += "logits[" + std::to_string(i) + "," + std::to_string(e) + "] ";
    }
  for (size_t i = (size_t)n * n_expert; i < y.size(); ++i)
    if (y[i] != kGuard) ++bad, detail += "written past the end ";
  char name[96];
  std::snprintf(name, sizeof name, "moe_router %s E=%d dim=%d n=%d%s", std::string(type_name(t)).c_str(),
                n_expert, dim, n, bias ? " bias" : "");
  result(bad == 0, name, detail);
}

// --bench: one layer of a Qwen3-30B-A3B-shaped MoE (128 experts, 8 used, dim 2048, expert ffn 768) in BF16
// and Q8_0: the router's top-k and the experts' FFN for one row (decode) and 512 rows (prefill), microseconds
// and the bytes of the experts read per decode step over the time.
void bench() {
  const int E = 128, k = 8, dim = 2048, ffn = 768;
  for (GgmlType t : {GgmlType::BF16, GgmlType::Q8_0}) {
    cuda::ExpertWeights w[3];
    DevBuf<uint8_t> mem[3];
    for (int i = 0; i < 3; ++i) {
      const int rows = i == 2 ? dim : ffn, cols = i == 2 ? ffn : dim;
      const size_t rb = t == GgmlType::Q8_0 ? cuda::lowbit_row_bytes(t, cols) : (size_t)cols * 2;
      mem[i].alloc(rb * rows * E);
      CK(cudaMemset(mem[i].get(), 0x3c, rb * rows * E));
      w[i] = {t, mem[i].get(), rows, cols, rb, rb * rows, E};
    }
    for (int n : {1, 512}) {
      std::mt19937 rng(1);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> logits((size_t)n * E), xn((size_t)n * dim);
      for (float& v : logits) v = nd(rng);
      for (float& v : xn) v = nd(rng);
      DevBuf<float> d_logits(logits);
      DevBuf<float> d_xn(xn);
      DevBuf<float> d_x(std::vector<float>((size_t)n * dim, 0.0f));
      DevBuf<int32_t> d_ids(std::vector<int32_t>((size_t)n * k));
      DevBuf<float> d_w(std::vector<float>((size_t)n * k));
      DevBuf<uint8_t> ws(cuda::moe_scratch_bytes(n, k, E, ffn, dim));
      const cuda::MoeScratch s = cuda::moe_scratch(ws.get(), n, k, E, ffn, dim);
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      const int iters = n == 1 ? 200 : 20;
      double us_route = 0, us_all = 0;
      for (int pass = 0; pass < 2; ++pass) {
        CK(cudaEventRecord(a));
        for (int it = 0; it < iters; ++it) {
          CK(cuda::moe_route(d_logits.get(), n, E, k, true, d_ids.get(), d_w.get(), nullptr, &s));
          if (pass == 1)
            CK(cuda::moe_ffn(w[0], w[1], w[2], d_xn.get(), n, d_ids.get(), d_w.get(), k, d_x.get(), s,
                             nullptr, n == 1));
        }
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        (pass == 0 ? us_route : us_all) = 1000.0 * ms / iters;
      }
      const double bytes = (double)k * (2 * w[0].expert_bytes + w[2].expert_bytes);
      char line[256];
      std::snprintf(line, sizeof line, "bench %s n=%d: route %.1f us, route + experts %.1f us%s",
                    std::string(type_name(t)).c_str(), n, us_route, us_all, n == 1 ? "" : "\n");
      say("%s", line);
      if (n == 1) {
        std::snprintf(line, sizeof line, " (experts %.1f us: %.0f GB/s over the %.1f MB of 8 experts)\n",
                      us_all - us_route, bytes / ((us_all - us_route) * 1e3), bytes / 1e6);
        say("%s", line);
        // The one-row tiles (set_moe_decode_tiles): gate / up chunks in flight, down rows per warp.
        const int variants[][2] = {{8, 1}, {8, 2}, {2, 2}, {4, 1}, {4, 2}, {4, 4}, {2, 4}};
        for (const auto& v : variants) {
          cuda::set_moe_decode_tiles(v[0], v[1]);
          CK(cudaEventRecord(a));
          for (int it = 0; it < iters; ++it) {
            CK(cuda::moe_route(d_logits.get(), n, E, k, true, d_ids.get(), d_w.get(), nullptr, &s));
            CK(cuda::moe_ffn(w[0], w[1], w[2], d_xn.get(), n, d_ids.get(), d_w.get(), k, d_x.get(), s,
                             nullptr, true));
          }
          CK(cudaEventRecord(b));
          CK(cudaEventSynchronize(b));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, a, b));
          const double us = 1000.0 * ms / iters - us_route;
          std::snprintf(line, sizeof line,
                        "  tiles gate_unroll %d down_rows %d: experts %.1f us (%.0f GB/s)\n", v[0], v[1], us,
                        bytes / (us * 1e3));
          say("%s", line);
        }
        cuda::set_moe_decode_tiles(0, 0);
      }
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  bool do_bench = false, only_bench = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (std::string(argv[i]) == "--bench") {
      do_bench = true;
    } else if (std::string(argv[i]) == "--bench-only") {
      do_bench = only_bench = true;
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR] [--bench | --bench-only]\n", argv[0]);
      return 2;
    }
  }
  if (const int skip = test::skip_without_device()) return skip;
  if (!out_dir.empty() && !(g_log = open_log(out_dir, "test_cuda_moe.txt"))) return 2;
  std::mt19937 rng(20261206);
  if (only_bench) {
    bench();
    return 0;
  }

  for (int n_expert : {4, 8, 60, 128, 256})
    for (int k : {1, 2, 8})
      if (k <= n_expert)
        for (bool norm : {false, true})
          for (int n : {1, 33}) check_route(n_expert, k, norm, n, rng);

  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
    for (int n : {1, 9, 40}) check_router(t, t == GgmlType::Q8_0 ? 64 : 60, 256, n, rng);

  // gpt-oss's routing (32 and 128 experts, 4 used) and its router's bias
  for (int n_expert : {4, 32, 128, 256})
    for (int k : {1, 4, 8})
      if (k <= n_expert)
        for (int n : {1, 33})
          for (bool ties : {false, true}) check_route_topk_softmax(n_expert, k, n, ties, false, rng);
  check_route_topk_softmax(32, 4, 33, false, true, rng);
  check_route_topk_softmax(8, 8, 9, true, true, rng);
  for (GgmlType t : {GgmlType::F32, GgmlType::BF16})
    for (int n : {1, 40}) check_router(t, 32, 256, n, rng, true);

  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    cases.push_back({t, 4, 2, 64, 64, 1});
    cases.push_back({t, 4, 2, 64, 64, 48});
    cases.push_back({t, 64, 8, 256, 128, 1});
    cases.push_back({t, 64, 8, 256, 128, 5});
    cases.push_back({t, 8, 2, 128, 96, 130});  // ~33 pairs per expert: several tiles each
    cases.push_back({t, 128, 8, 128, 64, 3});
  }
  // MXFP4 (gpt-oss's experts, decoded in registers): the shapes above that have columns in 32s, plus
  // gpt-oss-20b's 2880 columns (not a multiple of 256: a partial last chunk per lane)
  cases.push_back({GgmlType::MXFP4, 4, 2, 64, 64, 1});
  cases.push_back({GgmlType::MXFP4, 4, 2, 64, 64, 48});
  cases.push_back({GgmlType::MXFP4, 64, 8, 256, 128, 5});
  cases.push_back({GgmlType::MXFP4, 8, 2, 128, 96, 130});
  cases.push_back({GgmlType::MXFP4, 8, 2, 2048 + 64, 1056, 1, false, true});
  cases.push_back({GgmlType::MXFP4, 4, 2, 2880, 320, 1, false, true});
  cases.push_back({GgmlType::MXFP4, 4, 2, 2880, 320, 7});
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    cases.push_back({t, 128, 8, 256, 96, 1, false, true});
    cases.push_back({t, 8, 2, 2048 + 64, 1056, 1, false, true});  // columns past the unrolled chunks
    cases.push_back({t, 16, 3, 128, 64, 1, false, true});  // k not dividing 8: down per slot, then the sum
  }
  cases.push_back({GgmlType::BF16, 256, 8, 64, 32, 2});
  cases.push_back({GgmlType::BF16, 16, 1, 64, 32, 9});
  cases.push_back({GgmlType::BF16, 64, 8, 512, 256, 300});  // prefill: many 64-pair tiles
  cases.push_back({GgmlType::BF16, 8, 4, 64, 32, 6, true});
  // gpt-oss: biased experts and swiglu_oai on every path (decode kernels through the router, k dividing 8
  // and not; the grouped f32 GEMVs; the BF16 tensor cores), its experts' type (MXFP4), BF16 and F32
  for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::MXFP4}) {
    cases.push_back({t, 32, 4, 256, 128, 1, false, true, true});
    cases.push_back({t, 16, 3, 128, 64, 1, false, true, true});
    cases.push_back({t, 32, 4, 256, 128, 16, false, false, true});
    cases.push_back({t, 32, 4, 256, 128, 32, false, false, true});
    cases.push_back({t, 32, 4, 256, 128, 40, false, false, true});
  }
  for (const Case& c : cases) {
    std::string detail;
    const int bad = run_ffn(c, rng, detail);
    result(bad == 0, "moe_ffn " + case_name(c), detail);
  }
  {  // the tensor-core path's comparison catches a wrong expert too
    std::string detail;
    const Case c{GgmlType::BF16, 8, 2, 64, 64, 48};
    const int bad = run_ffn(c, rng, detail, true);
    result(bad > 0, "self-check: a wrong expert fails the BF16 bound (" + detail + ")", "");
  }
  {  // the comparison catches a wrong expert
    std::string detail;
    const Case c{GgmlType::F32, 8, 2, 64, 64, 4};
    const int bad = run_ffn(c, rng, detail, true);
    result(bad > 0, "self-check: a wrong expert fails the bound (" + std::to_string(bad) + " bad)", "");
  }
  for (int n : {1, 4}) {  // ... and an ignored bias (decode and grouped paths)
    std::string detail;
    const Case c{GgmlType::F32, 8, 2, 64, 64, n, false, n == 1, true};
    const int bad = run_ffn(c, rng, detail, false, true);
    result(bad > 0, "self-check: a missing down bias fails the bound (" + std::to_string(bad) + " bad)", "");
  }
  if (do_bench) bench();
  char b[96];
  std::snprintf(b, sizeof b, "test_cuda_moe: %d passed, %d failed\n", g_pass, g_fail);
  say("%s", b);
  if (g_log) std::fclose(g_log);
  return g_fail ? 1 : 0;
}
