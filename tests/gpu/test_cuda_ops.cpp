// The CUDA side of the backend op harness (llama.cpp's test-backend-ops; the CPU side is
// tests/test_backend_ops.cpp): every case of tests/op_cases.h whose op and type the CUDA backend has a kernel
// for runs on that kernel, on the case's inputs (tests/op_inputs.h), against the same scalar reference (the
// *_ref functions of backend/cpu/ops.h) under the case's CUDA rule (op_cases.h's tol_cuda). Per op:
//   matmul       CudaMatmul::matmul, the backend's entry for every step size: gemv up to kGemvMaxRows rows,
//                the low-bit gemv (SIMT or tensor-core) up to kLowbitGemvMaxRows rows or where
//                gemv_lowbit_tc_ok, above that the BF16 copy of low-bit weights, cuBLASLt above kGemvMaxRows
//                rows; F32 / F16 / BF16 weights as stored, Q8_0 / F8_E4M3 / TERNARY and the GGUF block
//                types of gemv_kquant.h repacked into the device layout (lowbit_pack_rows); the block
//                types' GEMV runs three times: x through L1, staged in shared memory (set_kquant_stage), and
//                quantised to int8 (set_kquant_int8; against the reference of x as quantize_x_q8_ref gives
//                it, q * d exact in double then rounded to f32). The FP8 GEMM (W8A8, ULTRA_CUDA_FP8_GEMM) is
//                turned off: another numerics, which test_cuda_kernels checks.
//   rmsnorm, silu_mul, gelu_mul, softcap, rope (q only), f16_convert (convert_f32 to F16)
//   attention    the history uploaded from the CPU's cache, this step's rows written by cuda::kv_write (the
//                device cache then bit-identical to the CPU's), cuda::attention with the plan's split count,
//                then 1 and 5 splits; gpt-oss's sinks (the per-row kernel)
// Cases without a kernel (the block types' matmul, the int8 activation quantiser, head_dim % 8 != 0) are
// skipped with the reason, listed and counted. Outputs are filled with kGuard before each run (an element
// not written fails) and carry 16 guard values past their end.
//
//   test_cuda_ops [--filter SUBSTRING] [--out DIR]
// Prints a line per case (PASS / FAIL / SKIP with the kernel path), then passed / failed / skipped per op
// and "test_cuda_ops: N passed, M failed, K skipped". --out DIR: also writes DIR/test_cuda_ops.txt.
// Exit 0 when none failed, 1 on a failure, 77 without a CUDA device (ctest's skip code in this repo), 2 on
// bad arguments.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "core/dtype.h"
#include "cpu_test_data.h"
#include "gpu_program.h"
#include "op_cases.h"
#include "op_inputs.h"

using namespace ultra;
using namespace ultra::test;

namespace {

// ---- output (gpu_program.h: say, CK, DevBuf, guarded)

struct Counts {
  int pass = 0, fail = 0, skip = 0;
};
std::map<std::string, Counts> g_counts;  // per op

void summary() {
  Counts all;
  say("%-12s %7s %7s %7s\n", "op", "passed", "failed", "skipped");
  for (const auto& [op, n] : g_counts) {
    say("%-12s %7d %7d %7d\n", op.c_str(), n.pass, n.fail, n.skip);
    all.pass += n.pass, all.fail += n.fail, all.skip += n.skip;
  }
  say("test_cuda_ops: %d passed, %d failed, %d skipped\n", all.pass, all.fail, all.skip);
}

// ---- comparison

// The outcome of one case: elements outside the rule (and guards overwritten), the kernel path taken, the
// first mismatches.
struct Outcome {
  int bad = 0;
  std::string path, detail;
  void note(const std::string& why) {
    if (detail.size() < 600) detail += (detail.empty() ? "" : "; ") + why;
  }
  void fail(const std::string& why) {
    ++bad;
    note(why);
  }
};

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// y: the downloaded output (n elements, then kTail guards); mag: Mag of each element (null: 1).
void compare(Outcome& o, const char* what, const Tol& tol, const std::vector<float>& y, const float* ref,
             const double* mag, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double bound;
    if (!within(tol, y[i], ref[i], mag ? mag[i] : 1.0, &bound) && ++bad <= 3)
      o.note(fmt("%s i=%zu y=%.9g ref=%.9g |diff|=%.3g bound=%.3g", what, i, y[i], ref[i],
                 std::fabs((double)y[i] - ref[i]), bound));
  }
  o.bad += bad;
  for (size_t i = n; i < y.size(); ++i)
    if (y[i] != kGuard) {
      o.fail(fmt("%s written past the end", what));
      break;
    }
}

bool launch_ok(Outcome& o, const char* what, cudaError_t e) {
  if (e == cudaSuccess) return true;
  o.fail(fmt("%s: %s", what, cudaGetErrorString(e)));
  return false;
}

// ---- which cases the CUDA backend has a kernel for

bool dense(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// "" when it has one, else why not.
std::string no_kernel(const OpCase& c) {
  switch (c.op) {
    case Op::Matmul:
      if (dense(c.type)) return "";
      if (!cuda::is_lowbit(c.type))
        return "no CUDA kernel for " + std::string(type_name(c.type)) + " weights";
      if (cuda::lowbit_row_bytes(c.type, c.cols) == 0) return "the device layout does not take these columns";
      return "";
    case Op::Attention:
      if (!dense(c.type)) return "no CUDA kernel for a " + std::string(type_name(c.type)) + " cache";
      if (c.cols % 8 != 0 || c.cols > 256) return "the CUDA attention kernels take head_dim % 8 == 0, <= 256";
      return "";
    case Op::Rope:
      return c.cols % 2 == 0 && c.cols <= 1024 ? "" : "the CUDA RoPE takes an even head_dim <= 1024";
    case Op::QuantizeQ8:
      return "the CUDA backend has no int8 activation quantiser (its Q8_0 kernels take f32 activations)";
    case Op::RmsNorm:
    case Op::SiluMul:
    case Op::GeluMul:
    case Op::Softcap:
    case Op::F16Convert:
      return "";
  }
  return "unknown op";
}

// ---- matmul

cuda::DeviceInfo g_dev;
cuda::CudaMatmul* g_mm = nullptr;

// Weights on the device: F32 / F16 / BF16 as stored, Q8_0 / F8_E4M3 / TERNARY in the device layout with
// their scales.
struct DevWeights {
  DevBuf<uint8_t> data;
  DevBuf<float> scale;
  WeightView view;
};
std::unique_ptr<DevWeights> upload(const WeightView& w) {
  auto d = std::make_unique<DevWeights>();
  const bool lowbit = cuda::is_lowbit(w.type);
  const size_t rb = lowbit ? cuda::lowbit_row_bytes(w.type, w.cols) : w.row_bytes;
  std::vector<uint8_t> bytes(rb * w.rows);
  if (lowbit) {
    if (!cuda::lowbit_pack_rows(w, 0, w.rows, bytes.data())) return nullptr;
  } else {
    std::memcpy(bytes.data(), w.data, bytes.size());
  }
  d->data = DevBuf<uint8_t>(bytes);
  d->view = w;
  d->view.data = d->data.get();
  d->view.row_bytes = rb;
  if (lowbit && w.scale) {
    const int64_t n = cuda::lowbit_scale_count(w);
    d->scale = DevBuf<float>(std::vector<float>(w.scale, w.scale + n));
    d->view.scale = d->scale.get();
  }
  return d;
}

float round_to(GgmlType t, float v) {
  return t == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(v)) : bf16_to_fp32(fp32_to_bf16(v));
}

// CudaMatmul::matmul against matmul_ref on what its path reads: where the path rounds the weights (the BF16
// copy of low-bit weights) or x (to the weight type for cuBLASLt), the reference is given them rounded the
// same way (round to nearest even, as lowbit_dequant_bf16 and convert_f32). drop_cols > 0 (the harness's
// self-check): the kernel is given a view of that many columns fewer, the reference the whole matrix.
Outcome run_matmul(const OpCase& c, int drop_cols = 0) {
  Outcome o;
  const auto in = matmul_inputs(c);
  const auto dw = upload(in->wt.view);
  if (!dw) {
    o.fail("lowbit_pack_rows refused the weights");
    return o;
  }
  dw->view.cols -= drop_cols;
  const int nt = c.tokens;
  const size_t ny = (size_t)c.rows * nt;
  DevBuf<float> dx(in->x), db(c.bias ? in->bias : std::vector<float>(1)), dy = guarded(ny, kGuard);
  const float* b = in->bias_ptr();
  const cudaError_t e = g_mm->matmul(dw->view, dx.get(), nt, dy.get(), b ? db.get() : nullptr, false, 0);
  if (!launch_ok(o, "CudaMatmul::matmul", e)) {
    o.detail += fmt(" (cublas status %d)", g_mm->last_cublas_status());
    return o;
  }
  CK(cudaDeviceSynchronize());
  const std::vector<float> y = dy.all();

  // The path (the dispatch of CudaMatmul::matmul, gemm.cu) and what it rounds.
  const bool lowbit = cuda::is_lowbit(c.type);
  const bool tc = lowbit && cuda::gemv_lowbit_tc_ok(dw->view, nt);
  const bool direct = nt <= (lowbit ? cuda::kLowbitGemvMaxRows : cuda::kGemvMaxRows) || tc;
  // The GGUF block types' GEMV both ways (gemv_kquant.h: x through L1 and staged in shared memory), each
  // held to the rule below.
  std::vector<float> y_staged;
  if (direct && cuda::is_kquant(c.type)) {
    DevBuf<float> dy2 = guarded(ny, kGuard);
    cuda::set_kquant_stage(1);
    const cudaError_t e2 = g_mm->matmul(dw->view, dx.get(), nt, dy2.get(), b ? db.get() : nullptr, false, 0);
    cuda::set_kquant_stage(-1);
    if (!launch_ok(o, "CudaMatmul::matmul (x staged)", e2)) return o;
    CK(cudaDeviceSynchronize());
    y_staged = dy2.all();
  }
  // And with int8 activations (gemv_kquant_q8), against the reference of x as the CPU quantises it.
  std::vector<float> y_int8, x_int8;
  if (direct && cuda::is_kquant(c.type) && cuda::kquant_q8_ok(dw->view, nt)) {
    DevBuf<float> dy3 = guarded(ny, kGuard);
    cuda::set_kquant_int8(1);
    const cudaError_t e3 = g_mm->matmul(dw->view, dx.get(), nt, dy3.get(), b ? db.get() : nullptr, false, 0);
    cuda::set_kquant_int8(-1);
    if (!launch_ok(o, "CudaMatmul::matmul (x int8)", e3)) return o;
    CK(cudaDeviceSynchronize());
    y_int8 = dy3.all();
    x_int8.resize(in->x.size());
    std::vector<int8_t> xq(c.cols);
    std::vector<float> xd(c.cols / 32);
    for (int t = 0; t < nt; ++t) {
      cpu::detail::quantize_x_q8_ref(in->x.data() + t * c.cols, c.cols, xq.data(), xd.data());
      for (int64_t i = 0; i < c.cols; ++i) x_int8[t * c.cols + i] = (float)((double)xq[i] * xd[i / 32]);
    }
  }
  WeightView rv = in->wt.view;
  const std::vector<double>* wv = &in->wv;
  std::vector<uint16_t> w16;
  std::vector<double> wv16;
  std::vector<float> x = in->x;
  if (direct) {
    o.path = !lowbit ? "gemv" : tc ? "low-bit tensor-core gemv" : "low-bit gemv";
  } else {
    if (lowbit) {  // each weight the f32 product decode * scale (exact in double, rounded once) to BF16
      w16.resize(in->wv.size());
      for (size_t i = 0; i < w16.size(); ++i) w16[i] = fp32_to_bf16((float)in->wv[i]);
      rv = WeightView{GgmlType::BF16, w16.data(), c.rows, c.cols, (size_t)c.cols * 2};
      wv16 = decode_weights(rv);
      wv = &wv16;
      o.path = "BF16 copy + ";
    }
    if (nt > cuda::kGemvMaxRows) {
      if (rv.type != GgmlType::F32)
        for (float& v : x) v = round_to(rv.type, v);
      o.path += rv.type == GgmlType::F32 ? "cuBLASLt f32"
                                         : "cuBLASLt, x rounded to " + lower_name(type_name(rv.type));
    } else {
      o.path += "gemv";
    }
  }
  // y against the reference of x (rounded or not).
  const auto check = [&](Outcome& out, const std::vector<float>& xr) {
    std::vector<float> ref(ny);
    cpu::matmul_ref(rv, xr.data(), nt, ref.data(), b);
    const auto mag = dot_magnitudes(*wv, c.rows, c.cols, xr.data(), nt, b);
    compare(out, "y", tol_cuda(c), y, ref.data(), mag.data(), ny);
    if (!y_staged.empty()) compare(out, "y (x staged)", tol_cuda(c), y_staged, ref.data(), mag.data(), ny);
  };
  check(o, x);
  if (!y_int8
           .empty()) {  // y (x int8) against the reference of the quantised x (exact products, rounded once)
    std::vector<float> ref(ny);
    cpu::matmul_ref(rv, x_int8.data(), nt, ref.data(), b);
    const auto mag = dot_magnitudes(*wv, c.rows, c.cols, x_int8.data(), nt, b);
    compare(o, "y (x int8)", tol_cuda(c), y_int8, ref.data(), mag.data(), ny);
  }
  if (o.bad && x != in->x) {
    // Where cuBLASLt has no algorithm for the shape, CudaMatmul::matmul runs gemv, 32 rows at a time, on x
    // as it is: the other path of the entry, held to the same rule against its own reference.
    Outcome g;
    check(g, in->x);
    if (!g.bad) {
      g.path = o.path.substr(0, o.path.find("cuBLASLt")) + "gemv (no cuBLASLt algorithm: the fallback)";
      return g;
    }
  }
  return o;
}

// ---- element-wise ops

Outcome run_rmsnorm(const OpCase& c) {
  Outcome o;
  const int rows = (int)c.rows, n = (int)c.cols;
  const auto x = randn(rows * n, c.seed, 2.0f), w = randn(n, c.seed + 1);
  std::vector<float> ref(rows * n);
  cpu::rmsnorm_ref(x.data(), w.data(), rows, n, 1e-5f, ref.data());
  DevBuf<float> dx(x), dw(w), dy = guarded(ref.size(), kGuard);
  o.path = "rmsnorm";
  if (!launch_ok(o, "rmsnorm", cuda::rmsnorm(dx.get(), dw.get(), rows, n, 1e-5f, dy.get(), 0))) return o;
  CK(cudaDeviceSynchronize());
  compare(o, "y", tol_cuda(c), dy.all(), ref.data(), nullptr, ref.size());
  return o;
}

// silu_mul (gelu = false) or gelu_mul, with the gates and the magnitudes of the CPU harness.
Outcome run_gated(const OpCase& c, bool gelu) {
  Outcome o;
  const int64_t n = c.cols;
  const auto g = gates(c, gelu ? 4.0f : 6.0f), u = randn(n, c.seed + 1);
  std::vector<float> ref(n);
  (gelu ? cpu::gelu_mul_ref : cpu::silu_mul_ref)(g.data(), u.data(), n, ref.data());
  std::vector<double> mag(n, 1.0);
  if (gelu)
    for (int64_t i = 0; i < n; ++i) mag[i] = std::fabs(u[i]);
  DevBuf<float> dg(g), du(u), dy = guarded(n, kGuard);
  o.path = gelu ? "gelu_mul" : "silu_mul";
  if (!launch_ok(o, o.path.c_str(),
                 (gelu ? cuda::gelu_mul : cuda::silu_mul)(dg.get(), du.get(), n, dy.get(), 0)))
    return o;
  CK(cudaDeviceSynchronize());
  compare(o, "y", tol_cuda(c), dy.all(), ref.data(), mag.data(), n);
  return o;
}

Outcome run_softcap(const OpCase& c) {
  Outcome o;
  const int64_t n = c.cols;
  const auto x = randn(n, c.seed, 40.0f);
  std::vector<float> ref = x;
  cpu::softcap_ref(ref.data(), n, c.param);
  const std::vector<double> mag(n, c.param);
  DevBuf<float> dx = guarded(n, kGuard, &x);
  o.path = "softcap";
  if (!launch_ok(o, "softcap", cuda::softcap(dx.get(), n, c.param, 0))) return o;
  CK(cudaDeviceSynchronize());
  const auto y = dx.all();
  compare(o, "x", tol_cuda(c), y, ref.data(), mag.data(), n);
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(y[i]) > c.param) {
      o.fail(fmt("x i=%lld above the cap: %.9g", (long long)i, y[i]));
      break;
    }
  return o;
}

// f32 -> f16 against fp32_to_fp16, bit for bit (NaN: any NaN code); the guards are 0xabcd codes.
Outcome run_f16(const OpCase& c) {
  Outcome o;
  const int64_t n = c.cols;
  const auto x = f16_inputs(c);
  DevBuf<float> dx(x);
  DevBuf<uint16_t> dh = guarded<uint16_t>(n, 0xabcd);
  o.path = "convert_f32 to f16";
  if (!launch_ok(o, "convert_f32", cuda::convert_f32(dx.get(), n, GgmlType::F16, dh.get(), 0))) return o;
  CK(cudaDeviceSynchronize());
  const auto h = dh.all();
  std::vector<float> y(n + kTail, kGuard), ref(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = fp16_to_fp32(h[i]);  // one f32 per f16 code (NaN codes to NaN)
    ref[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
  }
  compare(o, "f16", tol_cuda(c), y, ref.data(), nullptr, n);
  for (size_t i = n; i < h.size(); ++i)
    if (h[i] != 0xabcd) {
      o.fail("f16 written past the end");
      break;
    }
  return o;
}

Outcome run_rope(const OpCase& c) {
  Outcome o;
  const int nt = c.tokens, nh = (int)c.rows, hd = (int)c.cols;
  const auto in = rope_inputs(c);
  std::vector<float> ref = in.x;
  cpu::rope_ref(ref.data(), nt, nh, hd, in.pos.data(), in.inv.data(), c.interleaved, c.param);
  DevBuf<float> dq = guarded(in.x.size(), kGuard, &in.x), dinv(in.inv);
  DevBuf<int32_t> dpos(in.pos);
  o.path = "rope (q)";
  if (!launch_ok(
          o, "rope",
          cuda::rope(dq.get(), nh, nullptr, 0, nt, hd, dpos.get(), dinv.get(), c.interleaved, 0, c.param)))
    return o;
  CK(cudaDeviceSynchronize());
  compare(o, "q", tol_cuda(c), dq.all(), ref.data(), in.mag.data(), ref.size());
  return o;
}

// ---- attention

Outcome run_attention(const OpCase& c) {
  Outcome o;
  const int nh = (int)c.rows, nt = c.tokens;
  AttentionInputs in(c);
  DevBuf<uint8_t> dk(in.cache.k), dv(in.cache.v);
  KvLayerView kv = in.cache.view;
  kv.k = dk.get();
  kv.v = dv.get();
  DevBuf<int32_t> dpos(in.pos), dslot(in.slot);
  DevBuf<float> dks(in.k), dvs(in.v), dq(in.q);
  if (!launch_ok(o, "kv_write", cuda::kv_write(kv, dks.get(), dvs.get(), nt, dpos.get(), dslot.get(), 0)))
    return o;
  CK(cudaDeviceSynchronize());
  cpu::kv_write(in.cache.view, in.k.data(), in.v.data(), nt, in.pos.data(), in.slot.data());
  if (dk.all() != in.cache.k || dv.all() != in.cache.v)
    o.fail("kv_write: the device cache differs from the CPU's");
  std::vector<float> ref((size_t)nt * nh * c.cols);
  cpu::attention_ref(in.cache.view, in.q.data(), nt, nh, in.pos.data(), in.slot.data(), in.scale, ref.data(),
                     c.softcap, c.window, in.sinks.empty() ? nullptr : in.sinks.data());
  DevBuf<float> dsinks(in.sinks.empty() ? std::vector<float>(1) : in.sinks);
  const std::vector<double> mag(ref.size(), in.vmax);
  o.path = "attention splits";
  for (int force : {0, 1, 5}) {
    const cuda::AttentionPlan plan = cuda::plan_attention(g_dev, kv, nh, nt, force);
    DevBuf<uint8_t> ws(plan.workspace_bytes);
    DevBuf<float> out = guarded(ref.size(), kGuard);
    o.path += fmt(" %d%s", plan.n_splits, cuda::attention_tiled(plan, nt) ? " (tiled)" : "");
    if (!launch_ok(
            o, "attention",
            cuda::attention(plan, kv, dq.get(), nt, dpos.get(), dslot.get(), in.scale, out.get(), ws.get(), 0,
                            c.softcap, c.window, in.sinks.empty() ? nullptr : dsinks.get())))
      continue;
    CK(cudaDeviceSynchronize());
    compare(o, fmt("out (splits %d)", plan.n_splits).c_str(), tol_cuda(c), out.all(), ref.data(), mag.data(),
            ref.size());
  }
  return o;
}

// The harness fails a wrong kernel: F32 and BF16 decode steps whose kernel misses the last 8 columns (the
// tensor-core gemv's last k-step) must fail the rule.
void check_catches_wrong_kernel() {
  Counts& n = g_counts["harness"];
  for (GgmlType t : {GgmlType::F32, GgmlType::BF16}) {
    OpCase c{Op::Matmul, t, 33, 768, 1, {1}, tol_matmul()};
    c.seed = 7;
    const std::string name = case_name(c) + " missing its last 8 columns";
    const Outcome good = run_matmul(c), bad = run_matmul(c, 8);
    const bool ok = good.bad == 0 && bad.bad > 0;
    (ok ? n.pass : n.fail)++;
    say("%s harness: %s fails (%d bad; whole: %d bad)%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), bad.bad,
        good.bad, good.bad ? ": " : "", good.detail.c_str());
  }
}

Outcome run(const OpCase& c) {
  switch (c.op) {
    case Op::Matmul:
      return run_matmul(c);
    case Op::RmsNorm:
      return run_rmsnorm(c);
    case Op::SiluMul:
      return run_gated(c, false);
    case Op::GeluMul:
      return run_gated(c, true);
    case Op::Softcap:
      return run_softcap(c);
    case Op::F16Convert:
      return run_f16(c);
    case Op::Rope:
      return run_rope(c);
    case Op::Attention:
      return run_attention(c);
    case Op::QuantizeQ8:
      break;
  }
  Outcome o;
  o.fail("no runner for this op");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter, out_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--filter SUBSTRING] [--out DIR]\n", argv[0]);
      return 2;
    }
  }
  if (const int skip = skip_without_device()) return skip;
  if (!out_dir.empty() && !(g_log = open_log(out_dir, "test_cuda_ops.txt"))) return 2;
  g_before_fatal = summary;
  CK(cuda::query_device(0, &g_dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  say("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, g_dev.n_sms);
  cuda::tuning::set_fp8_gemm(0);

  const std::vector<OpCase> cases = op_cases();
  // One CudaMatmul for every matmul case: its workspace for the most tokens and columns, and the BF16 copy
  // of the largest low-bit matrix.
  int max_n = 1;
  int64_t max_cols = 1, max_lowbit = 0;
  for (const OpCase& c : cases)
    if (c.op == Op::Matmul && no_kernel(c).empty()) {
      max_n = std::max(max_n, c.tokens);
      max_cols = std::max(max_cols, c.cols);
      if (cuda::is_lowbit(c.type)) max_lowbit = std::max(max_lowbit, c.rows * cuda::lowbit_bf16_ld(c.cols));
    }
  DevBuf<uint8_t> mm_ws(cuda::CudaMatmul::workspace_bytes(max_n, max_cols, max_lowbit));
  cuda::CudaMatmul mm;
  CK(mm.init(mm_ws.get(), mm_ws.size()));
  g_mm = &mm;

  for (const OpCase& c : cases) {
    const std::string name = case_name(c);
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    Counts& n = g_counts[op_name(c.op)];
    const std::string why = no_kernel(c);
    if (!why.empty()) {
      ++n.skip;
      say("SKIP %s: %s\n", name.c_str(), why.c_str());
      continue;
    }
    const Outcome o = run(c);
    (o.bad ? n.fail : n.pass)++;
    if (o.bad)
      say("FAIL %s [%s] %d bad: %s\n", name.c_str(), o.path.c_str(), o.bad, o.detail.c_str());
    else
      say("PASS %s [%s]\n", name.c_str(), o.path.c_str());
  }
  if (filter.empty()) check_catches_wrong_kernel();
  summary();
  if (g_log) std::fclose(g_log);
  int failed = 0;
  for (const auto& [op, n] : g_counts) failed += n.fail;
  return failed ? 1 : 0;
}
