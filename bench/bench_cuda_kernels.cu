// Bandwidth benchmark of the CUDA kernels against two ceilings measured in the same run:
//   read     a plain streaming read of 2 GiB (16-byte loads, 4 in flight per thread, xor-reduced, tiny write)
//   copy     cudaMemcpyAsync device to device of 1 GiB (bytes read + bytes written)
// Then
//   gemv       BF16 Llama-like shapes for n = 1, 2, 4, 8, 16, 32: weight + activation bytes / time, and the
//              ratio to the read ceiling. Each timed graph runs 32 launches rotating over enough weight
//              copies that they span > 4x the L2 (so the cache cannot serve them).
//   attention  Llama-3-8B layer shape (32 heads, 8 kv heads, head_dim 128, F16 cache), one row, contexts
//              512, 4096, 32768: K + V bytes / time, rotating over slots for the same reason.
//   prefill    causal attention of one prefill chunk (rows at positions 0..n-1 of one sequence, n = 512 and
//              2048, F16 cache, head_dim 128) for the Llama-2-7B shape (32 heads, 32 kv heads) and the
//              Llama-3-8B shape (32 / 8): the per-row kernel against the tiled one
//              (AttentionTuning::tiled 1 / 2), time and TFLOP/s counting 4 * n^2 / 2 * heads * head_dim
//              flops (QK^T and PV over the causal half), and the largest difference between the two outputs
//              relative to their largest value (the tiled kernel rounds Q and P to F16: ~1e-3 expected).
//   sampler    V = 128256: greedy, top_k = 40 (+ top_p 0.95, min_p 0.05) and top_k = 0 top_p = 0.9,
//              microseconds per launch for 1 row and for 32 rows.
//   lowbit     gemv on Q8_0, F8_E4M3 (a scale per row) and TERNARY (a scale per tensor) weights in their
//              device layout (gemv_lowbit.h), Llama-3-8B shapes, n = 1, 2, 8, 32: us and weight + activation
//              bytes / time against the read ceiling (random codes: the arithmetic is that of any codes).
//   lowbit_bulk  the tensor-core low-bit gemv with register loads against its bulk-copy variant (1-6 ring
//              slots per warp), F8_E4M3 and TERNARY, n = 1 and 4.
//   kquant     gemv on the GGUF block types (gemv_kquant.h) and Q8_0 against BF16, Llama-3-8B shapes,
//              n = 1, 2, 4, 8; gemv_kquant with x staged in shared memory against x through L1; its
//              one-row tiles.
//   fp8_gemm   prefill matmuls (n = 128, 512, 2048) of F8_E4M3 weights: the BF16 copy + BF16 GEMM against
//              cuBLASLt's FP8 GEMM (x quantised per row), BF16 weights for reference.
// Times: CUDA events around graph replays (median of 7 trials, 5 with --sweep). Prints a table; --out DIR
// also writes DIR/bench_cuda_kernels.txt.
// --sweep adds columns: gemv variants (no PDL, the 2026-11 kernel, TF32 instead of BF16x3, other block
// shapes and split counts; see src/backend/cuda/tuning.h), attention and sampler without PDL. --only SECTION
// (read, gemv, attention, prefill, sampler, lowbit, lowbit_bulk, kquant, fp8_gemm; repeatable) runs those
// sections only (the read ceiling always runs).
//   bench_cuda_kernels [--out DIR] [--quick] [--sweep] [--only SECTION]...
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "core/dtype.h"
#include "gpu_program.h"

using namespace ultra;
using namespace ultra::cuda;
using namespace ultra::test;

namespace {

bool g_quick = false;
bool g_sweep = false;  // --sweep: gemv variants, attention / sampler with and without PDL
std::vector<std::string> g_only;
bool section(const char* name) {
  return g_only.empty() || std::find(g_only.begin(), g_only.end(), name) != g_only.end();
}
std::vector<std::string> g_summary;

template <class T>
T* dalloc(size_t count) {
  T* p = nullptr;
  CK(cudaMalloc(&p, count * sizeof(T)));
  return p;
}

// Fills device memory with pseudo-random bytes (never zeros: they can run faster than real data).
__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed, uint32_t mask) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = x & mask;
  }
}
// mask 0x3f7f3f7f keeps two bf16 / one f32 per word finite and below 2 in magnitude
void fill(void* p, size_t bytes, uint32_t seed, uint32_t mask = 0x3f7f3f7fu) {
  fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4, seed, mask);
  CK(cudaGetLastError());
}

__global__ void read_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = detail::ld_stream16(p + i), b = detail::ld_stream16(p + i + stride);
    const uint4 c = detail::ld_stream16(p + i + 2 * stride), d = detail::ld_stream16(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = detail::ld_stream16(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never: keeps the loads alive
}

// The read kernel with programmatic dependent launch: the next launch may start once every block runs.
__global__ void read_kernel_pdl(const uint4* p, size_t n16, uint32_t* sink) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  uint32_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = detail::ld_stream16(p + i), b = detail::ld_stream16(p + i + stride);
    const uint4 c = detail::ld_stream16(p + i + 2 * stride), d = detail::ld_stream16(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = detail::ld_stream16(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Median time (ms) of one call of `body`, captured `per_graph` times into a graph and replayed.
double time_graph(cudaStream_t st, int per_graph, const std::function<void(int)>& body, int reps = 5) {
  const int trials = g_sweep ? 5 : 7;  // the sweep measures many variants: fewer repetitions
  if (g_sweep) reps = std::min(reps, 3);
  body(0);  // direct warm-up: module loading and host-side plans happen outside the capture
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per_graph; ++i) body(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));  // warm-up
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int trial = 0; trial < trials; ++trial) {
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms / (reps * per_graph));
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

DeviceInfo g_dev;

double bench_read(cudaStream_t st) {
  const size_t bytes = g_quick ? (size_t)512 << 20 : (size_t)2 << 30;
  uint8_t* buf = dalloc<uint8_t>(bytes);
  uint32_t* sink = dalloc<uint32_t>(1);
  fill(buf, bytes, 1);
  double best = 0;
  for (int bps : {4, 8, 16}) {
    const int blocks = g_dev.n_sms * bps;
    const double ms = time_graph(st, 4, [&](int) {
      read_kernel<<<blocks, 256, 0, st>>>(reinterpret_cast<const uint4*>(buf), bytes / 16, sink);
    });
    const double gbs = bytes / ms / 1e6;
    say("  read ceiling: %d blocks x 256 threads: %.3f ms, %.0f GB/s\n", blocks, ms, gbs);
    best = std::max(best, gbs);
  }
  const size_t cbytes = bytes / 2;
  const double ms = time_graph(
      st, 4, [&](int) { CK(cudaMemcpyAsync(buf + cbytes, buf, cbytes, cudaMemcpyDeviceToDevice, st)); });
  const double cgbs = 2.0 * cbytes / ms / 1e6;
  say("  copy ceiling: cudaMemcpyAsync D2D %zu MB: %.3f ms, %.0f GB/s (read + write)\n", cbytes >> 20, ms,
      cgbs);
  g_summary.push_back(std::string("read ceiling ") + std::to_string((int)best) + " GB/s, D2D copy " +
                      std::to_string((int)cgbs) + " GB/s (read+write)");
  if (g_sweep) {  // the same read as a chain of 32 launches over gemv-sized buffers (rotating past the L2)
    for (size_t mb : {32, 112}) {
      const size_t b = mb << 20;
      const int copies = (int)std::max<size_t>(2, (4 * g_dev.l2_bytes + b - 1) / b);
      if ((size_t)copies * b > bytes) continue;
      for (int pdl = 0; pdl < 2; ++pdl) {
        const int blocks = g_dev.n_sms * 8;
        const double ms = time_graph(st, 32, [&](int i) {
          const uint4* p = reinterpret_cast<const uint4*>(buf + (size_t)(i % copies) * b);
          if (!pdl) {
            read_kernel<<<blocks, 256, 0, st>>>(p, b / 16, sink);
          } else {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(256);
            cfg.stream = st;
            cudaLaunchAttribute at;
            at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at.val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = &at;
            cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, read_kernel_pdl, p, b / 16, sink));
          }
        });
        say("  read chain %3zu MB x 32 launches%s: %.2f us, %.0f GB/s (%.1f%%)\n", mb,
            pdl ? " (PDL, overlapping)" : "", ms * 1e3, b / ms / 1e6, 100.0 * b / ms / 1e6 / best);
      }
    }
  }
  CK(cudaFree(buf));
  CK(cudaFree(sink));
  return best;
}

struct GemvVariant {
  const char* name;
  tuning::GemvTuning t;
  bool pdl;
};

void bench_gemv(cudaStream_t st, double ceiling) {
  struct S {
    const char* name;
    int64_t rows, cols;
  };
  const std::vector<S> shapes = {{"attn 4096x4096", 4096, 4096},       {"ffn up 14336x4096", 14336, 4096},
                                 {"ffn down 4096x14336", 4096, 14336}, {"lm_head 128256x4096", 128256, 4096},
                                 {"1B qkv 3072x2048", 3072, 2048},     {"1B gate_up 16384x2048", 16384, 2048},
                                 {"1B down 2048x8192", 2048, 8192}};
  const std::vector<int> ns = g_quick ? std::vector<int>{1, 8, 32} : std::vector<int>{1, 2, 4, 8, 16, 32};
  std::vector<GemvVariant> vs = {{"auto", {}, true}};
  {  // the weight-streaming kernel (n = 1; other n fall back to the column-split kernel)
    tuning::GemvTuning t;
    t.kernel = 3;
    vs.push_back({"stream", t, true});
    t.smem_budget = 96 << 10;
    vs.push_back({"stream-96K", t, true});
    t.smem_budget = 48 << 10;
    vs.push_back({"stream-48K", t, true});
  }
  if (g_sweep) {
    tuning::GemvTuning t;
    vs.push_back({"no-PDL", t, false});
    t.kernel = 1;
    vs.push_back({"colsplit", t, false});
    t.kernel = 2;
    vs.push_back({"splitK", t, true});
    t.pf_steps = 0;
    vs.push_back({"sK-pf0", t, true});
    t = {};
    t.kernel = 2, t.config = 1;
    vs.push_back({"sK-ring8", t, true});
    t.pf_steps = 0;
    vs.push_back({"sK-r8-pf0", t, true});
    t.pf_steps = -1;
    vs.push_back({"sK-r8-noPDL", t, false});
    t = {};
    t.kernel = 2, t.mma = 1;
    vs.push_back({"sK-tf32", t, true});
    t = {};
    t.kernel = 2, t.config = 2;
    vs.push_back({"sK-4w32r", t, true});
  }
  say("\n  gemv (BF16 weights, f32 activations): us/call (%% of read ceiling)");
  for (auto& v : vs) say(" | %s", v.name);
  say("\n");
  for (const S& s : shapes) {
    const size_t wbytes = (size_t)s.rows * s.cols * 2;
    const size_t span = 4 * g_dev.l2_bytes;
    const int copies = (int)std::max<size_t>(2, (span + wbytes - 1) / wbytes);
    std::vector<uint8_t*> w(copies);
    for (int i = 0; i < copies; ++i) {
      w[i] = dalloc<uint8_t>(wbytes);
      fill(w[i], wbytes, 100 + i);
    }
    float* x = dalloc<float>((size_t)32 * s.cols);
    float* y = dalloc<float>((size_t)32 * s.rows);
    fill(x, (size_t)32 * s.cols * 4, 7, 0x3f7fffffu);
    for (int n : ns) {
      say("  %-22s n=%-2d", s.name, n);
      for (size_t vi = 0; vi < vs.size(); ++vi) {
        tuning::set_gemv_tuning(vs[vi].t);
        set_programmatic_launch(vs[vi].pdl);
        const double ms = time_graph(st, 32, [&](int i) {
          WeightView wv{GgmlType::BF16, w[i % copies], s.rows, s.cols, (size_t)s.cols * 2};
          CK(gemv(wv, x, n, y, nullptr, false, st));
        });
        const double bytes = (double)wbytes + (double)n * s.cols * 4 + (double)n * s.rows * 4;
        const double gbs = bytes / ms / 1e6;
        say(" | %7.2f (%4.1f%%)", ms * 1e3, 100.0 * gbs / ceiling);
        if (vi == 0 && (n == 1 || n == 8 || n == 32))
          g_summary.push_back(std::string("gemv ") + s.name + " n=" + std::to_string(n) + ": " +
                              std::to_string(ms * 1e3).substr(0, 6) + " us, " + std::to_string((int)gbs) +
                              " GB/s = " + std::to_string((int)(100.0 * gbs / ceiling)) + "% of read");
      }
      say("\n");
    }
    tuning::set_gemv_tuning({});
    set_programmatic_launch(true);
    for (auto p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
}

void bench_attention(cudaStream_t st, double ceiling) {
  const int n_heads = 32, n_kv = 8, hd = 128;
  say("\n  attention (F16 cache, 32 heads, 8 kv heads, hd 128)  ctx  rows splits  us/call   GB/s  of "
      "read%s\n",
      g_sweep ? "  | variants: us/call" : "");
  for (int ctx : {512, 4096, 32768}) {
    for (int rows : {1, 8}) {
      const size_t slot_bytes = (size_t)n_kv * ctx * hd * 2 * 2;  // K + V
      const int n_slots = (int)std::max<size_t>(rows, (4 * g_dev.l2_bytes + slot_bytes - 1) / slot_bytes);
      const size_t ce = (size_t)n_slots * n_kv * ctx * hd;
      uint16_t* k = dalloc<uint16_t>(ce);
      uint16_t* v = dalloc<uint16_t>(ce);
      fill(k, ce * 2, 11, 0x3bff3bffu);  // f16 values below 1
      fill(v, ce * 2, 12, 0x3bff3bffu);
      KvLayerView kv{GgmlType::F16, k, v, n_slots, n_kv, ctx, hd};
      AttentionPlan plan = plan_attention(g_dev, kv, n_heads, rows);  // its tuning varied below (--sweep)
      uint8_t* ws = dalloc<uint8_t>(plan.workspace_bytes + 256);
      float* q = dalloc<float>((size_t)rows * n_heads * hd);
      float* o = dalloc<float>((size_t)rows * n_heads * hd);
      fill(q, (size_t)rows * n_heads * hd * 4, 13, 0x3f7fffffu);
      const int groups = std::max(1, n_slots / rows);
      std::vector<int32_t> pos((size_t)groups * rows, ctx - 1), seq((size_t)groups * rows);
      for (int gi = 0; gi < groups; ++gi)
        for (int r = 0; r < rows; ++r) seq[(size_t)gi * rows + r] = (gi * rows + r) % n_slots;
      int32_t* dpos = dalloc<int32_t>(pos.size());
      int32_t* dseq = dalloc<int32_t>(seq.size());
      CK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dseq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
      auto body = [&](int i) {
        const int gi = i % groups;
        CK(attention(plan, kv, q, rows, dpos + gi * rows, dseq + gi * rows, 0.088f, o, ws, st));
      };
      const double ms = time_graph(st, 32, body);
      const double bytes = (double)rows * slot_bytes;
      const double gbs = bytes / ms / 1e6;
      say("  %-50s %6d %4d %6d %8.2f %6.0f  %5.1f%%", "", ctx, rows, plan.n_splits, ms * 1e3, gbs,
          100.0 * gbs / ceiling);
      if (g_sweep) {
        const AttentionTuning planned = plan.tuning;
        plan.tuning.pdl = true;
        say("  | PDL %8.2f", time_graph(st, 32, body) * 1e3);
        plan.tuning.pdl = false;
        for (int stage : {1, 2}) {
          plan.tuning.stage = stage;
          say("  | %s %7.2f", stage == 1 ? "split-kernel" : "combine", time_graph(st, 32, body) * 1e3);
        }
        plan.tuning = planned;
        {  // one K/V tile in flight per block, more blocks per SM (the plan follows)
          AttentionTuning one = planned;
          one.max_stages = 1;
          const AttentionPlan p1 = plan_attention(g_dev, kv, n_heads, rows, 0, one);
          uint8_t* ws1 = dalloc<uint8_t>(p1.workspace_bytes + 256);
          const double ms1 = time_graph(st, 32, [&](int i) {
            const int gi = i % groups;
            CK(attention(p1, kv, q, rows, dpos + gi * rows, dseq + gi * rows, 0.088f, o, ws1, st));
          });
          say("  | 1 stage (%d splits) %7.2f", p1.n_splits, ms1 * 1e3);
          CK(cudaFree(ws1));
        }
        for (int fs : {rows * 8 * 4 <= 1024 ? 128 : 16, rows * 8 * 4 <= 1024 ? 256 : 32}) {
          if (fs > ctx / 64) continue;
          const AttentionPlan p2 = plan_attention(g_dev, kv, n_heads, rows, fs);
          uint8_t* ws2 = dalloc<uint8_t>(p2.workspace_bytes + 256);
          const double ms2 = time_graph(st, 32, [&](int i) {
            const int gi = i % groups;
            CK(attention(p2, kv, q, rows, dpos + gi * rows, dseq + gi * rows, 0.088f, o, ws2, st));
          });
          say("  | %d splits %7.2f", fs, ms2 * 1e3);
          CK(cudaFree(ws2));
        }
      }
      say("\n");
      g_summary.push_back("attention ctx=" + std::to_string(ctx) + " rows=" + std::to_string(rows) + ": " +
                          std::to_string(ms * 1e3).substr(0, 6) + " us, " + std::to_string((int)gbs) +
                          " GB/s");
      for (void* p : {(void*)k, (void*)v, (void*)ws, (void*)q, (void*)o, (void*)dpos, (void*)dseq})
        CK(cudaFree(p));
    }
  }
}

void bench_prefill(cudaStream_t st) {
  const int hd = 128;
  say("\n  prefill attention (F16 cache, hd 128, one sequence)   rows   per-row us  TFLOP/s    tiled us  "
      "TFLOP/s  "
      "speed-up  max diff\n");
  struct Shape {
    const char* name;
    int n_heads, n_kv;
  };
  for (const Shape& sh :
       {Shape{"7B (32 heads, 32 kv heads)", 32, 32}, Shape{"8B (32 heads, 8 kv heads)", 32, 8}})
    for (int n : {512, 2048}) {
      const int n_heads = sh.n_heads, n_kv = sh.n_kv, ctx = n;
      const size_t ce = (size_t)n_kv * ctx * hd;
      uint16_t* k = dalloc<uint16_t>(ce);
      uint16_t* v = dalloc<uint16_t>(ce);
      fill(k, ce * 2, 21, 0x3bff3bffu);  // f16 values below 1
      fill(v, ce * 2, 22, 0x3bff3bffu);
      KvLayerView kv{GgmlType::F16, k, v, 1, n_kv, ctx, hd};
      const size_t qn = (size_t)n * n_heads * hd;
      float* q = dalloc<float>(qn);
      float* o1 = dalloc<float>(qn);
      float* o2 = dalloc<float>(qn);
      fill(q, qn * 4, 23, 0x3dffffffu);  // f32 values below 0.125: moderate logits
      std::vector<int32_t> pos(n), seq(n, 0);
      for (int i = 0; i < n; ++i) pos[i] = i;
      int32_t* dpos = dalloc<int32_t>(n);
      int32_t* dseq = dalloc<int32_t>(n);
      CK(cudaMemcpy(dpos, pos.data(), n * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dseq, seq.data(), n * 4, cudaMemcpyHostToDevice));
      AttentionPlan plan = plan_attention(g_dev, kv, n_heads, n);
      uint8_t* ws = dalloc<uint8_t>(plan.workspace_bytes + 256);
      const double flops = 4.0 * n * (double)n / 2 * n_heads * hd;
      double ms[2];
      float* outs[2] = {o1, o2};
      for (int m = 0; m < 2; ++m) {
        plan.tuning.tiled = m + 1;
        ms[m] = time_graph(st, 4,
                           [&](int) { CK(attention(plan, kv, q, n, dpos, dseq, 0.088f, outs[m], ws, st)); });
      }
      CK(cudaStreamSynchronize(st));
      std::vector<float> h1(qn), h2(qn);
      CK(cudaMemcpy(h1.data(), o1, qn * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h2.data(), o2, qn * 4, cudaMemcpyDeviceToHost));
      double md = 0, mr = 0;
      for (size_t i = 0; i < qn; ++i) {
        md = std::max(md, (double)std::fabs(h1[i] - h2[i]));
        mr = std::max(mr, (double)std::fabs(h1[i]));
      }
      const double tf0 = flops / ms[0] / 1e9, tf1 = flops / ms[1] / 1e9;
      say("  %-50s %6d %12.1f %8.1f %11.1f %8.1f %8.2fx  %.1e%s\n", sh.name, n, ms[0] * 1e3, tf0, ms[1] * 1e3,
          tf1, ms[0] / ms[1], md / mr, plan.tiled ? "" : "  (plan: no tiled kernel)");
      g_summary.push_back(std::string("prefill ") + sh.name + " n=" + std::to_string(n) + ": per-row " +
                          std::to_string(ms[0] * 1e3).substr(0, 7) + " us (" +
                          std::to_string(tf0).substr(0, 5) + " TFLOP/s), tiled " +
                          std::to_string(ms[1] * 1e3).substr(0, 7) + " us (" +
                          std::to_string(tf1).substr(0, 5) + " TFLOP/s)");
      for (void* p :
           {(void*)k, (void*)v, (void*)q, (void*)o1, (void*)o2, (void*)dpos, (void*)dseq, (void*)ws})
        CK(cudaFree(p));
    }
}

void bench_sampler(cudaStream_t st) {
  const int V = 128256, max_rows = 32;
  SamplerPlan plan;
  CK(plan_sampler(g_dev, max_rows, V, 64, &plan));
  uint8_t* ws = dalloc<uint8_t>(plan.workspace_bytes);
  CK(sampler_workspace_init(plan, ws, st));
  float* logits = dalloc<float>((size_t)max_rows * V);
  {  // N(0, 3)-like logits on the host
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> h((size_t)max_rows * V);
    for (auto& v : h) v = nd(rng);
    CK(cudaMemcpy(logits, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  int32_t* hist = dalloc<int32_t>(64);
  CK(cudaMemset(hist, 0, 64 * 4));
  int32_t *tok = dalloc<int32_t>(max_rows), *err = dalloc<int32_t>(max_rows);
  int32_t* ttok = dalloc<int32_t>((size_t)max_rows * kSamplerMaxProbs);
  float *lp = dalloc<float>(max_rows), *tlp = dalloc<float>((size_t)max_rows * kSamplerMaxProbs);
  SamplerOutputs so{tok, lp, ttok, tlp, err};
  SamplerRow* drows = dalloc<SamplerRow>(max_rows);
  struct C {
    const char* name;
    float T;
    int k;
    float top_p, min_p;
    float rp;
    int n_probs = 5;
  };
  const C cases[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f},
                     {"greedy, no top logprobs", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0},
                     {"top_k=40 top_p=0.95 min_p=0.05", 0.8f, 40, 0.95f, 0.05f, 1.0f},
                     {"top_k=40 + repeat penalty (64)", 0.8f, 40, 0.95f, 0.05f, 1.1f},
                     {"top_k=0 top_p=0.9", 1.0f, 0, 0.9f, 0.0f, 1.0f},
                     {"top_k=0 top_p=0.9 T=3 (flat)", 3.0f, 0, 0.9f, 0.0f, 1.0f}};
  say("\n  sampler V=128256                              us/launch (1 row)   us/launch (32 rows)%s\n",
      g_sweep ? "  | no-PDL 1 row, 32 rows" : "");
  for (const C& c : cases) {
    std::vector<SamplerRow> rows(max_rows);
    for (int r = 0; r < max_rows; ++r) {
      SamplerRow& p = rows[r];
      p = SamplerRow{};
      p.temperature = c.T, p.top_k = c.k, p.top_p = c.top_p, p.min_p = c.min_p, p.repeat_penalty = c.rp;
      p.n_probs = c.n_probs, p.seed = 42 + r, p.position = 1000, p.hist = hist, p.n_hist = 64,
      p.logits_row = r;
    }
    CK(cudaMemcpy(drows, rows.data(), rows.size() * sizeof(SamplerRow), cudaMemcpyHostToDevice));
    double t[2];
    int i = 0;
    for (int n : {1, max_rows}) {
      t[i++] = time_graph(st, 8, [&](int) { CK(sample(plan, logits, V, V, drows, n, so, ws, st)); }) * 1e3;
    }
    say("  %-44s %10.1f %20.1f", c.name, t[0], t[1]);
    if (g_sweep) {
      set_programmatic_launch(false);
      for (int n : {1, max_rows})
        say("  | %6.1f",
            time_graph(st, 8, [&](int) { CK(sample(plan, logits, V, V, drows, n, so, ws, st)); }) * 1e3);
      set_programmatic_launch(true);
      for (int stage : {1, 2}) {
        tuning::set_sampler_stage(stage);
        for (int n : {1, max_rows})
          say("  | %s %6.1f", stage == 1 ? "segments" : "merge",
              time_graph(st, 8, [&](int) { CK(sample(plan, logits, V, V, drows, n, so, ws, st)); }) * 1e3);
      }
      tuning::set_sampler_stage(0);
    }
    say("\n");
    g_summary.push_back(std::string("sampler ") + c.name + ": " + std::to_string(t[0]).substr(0, 6) +
                        " us (1 row), " + std::to_string(t[1]).substr(0, 6) + " us (32 rows)");
  }
  for (void* p : {(void*)ws, (void*)logits, (void*)hist, (void*)tok, (void*)err, (void*)ttok, (void*)lp,
                  (void*)tlp, (void*)drows})
    CK(cudaFree(p));
}

}  // namespace

// Llama-3-8B matrices for the low-bit sections.
struct LowbitShape {
  const char* name;
  int64_t rows, cols;
};
const std::vector<LowbitShape>& lowbit_shapes() {
  static const std::vector<LowbitShape> v = {{"attn 4096x4096", 4096, 4096},
                                             {"kv 1024x4096", 1024, 4096},
                                             {"ffn up 14336x4096", 14336, 4096},
                                             {"ffn down 4096x14336", 4096, 14336},
                                             {"lm_head 128256x4096", 128256, 4096}};
  return v;
}

void bench_lowbit(cudaStream_t st, double ceiling) {
  const std::vector<LowbitShape>& shapes = lowbit_shapes();
  const std::vector<int> ns = g_quick ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1, 2, 4, 8, 32};
  say("\n  lowbit gemv (f32 activations): us/call (%% of read ceiling)  | q8_0 | fp8 | ternary | fp8 simt | "
      "ternary simt\n");
  for (const LowbitShape& s : shapes) {
    const GgmlType types[3] = {GgmlType::Q8_0, GgmlType::F8_E4M3, GgmlType::TERNARY};
    struct Mat {
      std::vector<uint8_t*> w;
      float* scale = nullptr;
      size_t rb = 0, bytes = 0;
    } m[3];
    for (int ti = 0; ti < 3; ++ti) {
      m[ti].rb = lowbit_row_bytes(types[ti], s.cols);
      const size_t wbytes = (size_t)s.rows * m[ti].rb;
      const int copies = (int)std::max<size_t>(2, (4 * g_dev.l2_bytes + wbytes - 1) / wbytes);
      for (int i = 0; i < copies; ++i) {
        m[ti].w.push_back(dalloc<uint8_t>(wbytes));
        fill(m[ti].w.back(), wbytes, 300 + i, 0x3c3c3c3cu);  // finite codes and scales (timing only)
      }
      m[ti].scale = dalloc<float>((size_t)s.rows);
      fill(m[ti].scale, (size_t)s.rows * 4, 9, 0x3c7fffffu);
      m[ti].bytes = wbytes + (types[ti] == GgmlType::F8_E4M3 ? (size_t)s.rows * 4 : 0);
    }
    float* x = dalloc<float>((size_t)32 * s.cols);
    float* y = dalloc<float>((size_t)32 * s.rows);
    fill(x, (size_t)32 * s.cols * 4, 7, 0x3f7fffffu);
    for (int n : ns) {
      say("  %-22s n=%-2d", s.name, n);
      // Columns 4 and 5: F8_E4M3 and TERNARY through the SIMT kernel (gemv_lowbit), where gemv() takes the
      // tensor-core or the streaming one.
      for (int col = 0; col < 5; ++col) {
        const int ti = col < 3 ? col : col - 2;
        const double ms = time_graph(st, 32, [&](int i) {
          WeightView wv{types[ti], m[ti].w[i % m[ti].w.size()], s.rows, s.cols, m[ti].rb, m[ti].scale};
          if (types[ti] == GgmlType::F8_E4M3) wv.scale_group = s.cols, wv.scale_row_stride = 1;
          if (types[ti] == GgmlType::TERNARY) wv.scale_group = s.cols, wv.scale_row_stride = 0;
          if (col >= 3)
            CK(gemv_lowbit(wv, x, n, y, nullptr, false, st));
          else
            CK(gemv(wv, x, n, y, nullptr, false, st));
        });
        const double bytes = (double)m[ti].bytes + (double)n * s.cols * 4 + (double)n * s.rows * 4;
        const double gbs = bytes / ms / 1e6;
        say(" | %7.2f (%4.1f%%)", ms * 1e3, 100.0 * gbs / ceiling);
        if (n == 1 || n == 4)
          g_summary.push_back(std::string("lowbit gemv ") +
                              (col == 0   ? "q8_0 "
                               : col == 1 ? "fp8 "
                               : col == 2 ? "ternary "
                               : col == 3 ? "fp8 simt "
                                          : "ternary simt ") +
                              s.name + " n=" + std::to_string(n) + ": " +
                              std::to_string(ms * 1e3).substr(0, 6) + " us, " + std::to_string((int)gbs) +
                              " GB/s = " + std::to_string((int)(100.0 * gbs / ceiling)) + "% of read");
      }
      say("\n");
    }
    for (auto& mm : m) {
      for (auto p : mm.w) CK(cudaFree(p));
      CK(cudaFree(mm.scale));
    }
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
}

// The GGUF block types (gemv_kquant.h: Q4_K, Q6_K, Q5_K, Q4_0) and Q8_0 against BF16, through gemv(), on
// the Llama-3-8B shapes: us per call and bytes read (weights in the device layout + x + y) / time against
// the read ceiling, n = 1, 2, 4, 8; then the one-row tiles of gemv_kquant (set_kquant_tile) for Q4_K / Q6_K.
void bench_kquant(cudaStream_t st, double ceiling) {
  const std::vector<LowbitShape>& shapes = lowbit_shapes();
  const GgmlType types[] = {GgmlType::BF16, GgmlType::Q4_K, GgmlType::Q6_K,
                            GgmlType::Q5_K, GgmlType::Q4_0, GgmlType::Q8_0};
  const char* names[] = {"bf16", "q4_k", "q6_k", "q5_k", "q4_0", "q8_0"};
  constexpr int kTypes = 6;
  const int tiles[] = {0, 12, 14, 22, 24, 42};
  say("\n  kquant gemv (f32 activations): us/call (%% of read ceiling) | bf16 | q4_k | q6_k | q5_k | q4_0 | "
      "q8_0\n");
  for (const LowbitShape& s : shapes) {
    if (s.rows > 16384) continue;
    struct Mat {
      std::vector<uint8_t*> w;
      size_t rb = 0, bytes = 0;
    } m[kTypes];
    for (int ti = 0; ti < kTypes; ++ti) {
      m[ti].rb = types[ti] == GgmlType::BF16 ? (size_t)s.cols * 2 : lowbit_row_bytes(types[ti], s.cols);
      m[ti].bytes = (size_t)s.rows * m[ti].rb;
      const int copies = (int)std::max<size_t>(2, (4 * g_dev.l2_bytes + m[ti].bytes - 1) / m[ti].bytes);
      for (int i = 0; i < copies; ++i) {
        m[ti].w.push_back(dalloc<uint8_t>(m[ti].bytes));
        fill(m[ti].w.back(), m[ti].bytes, 500 + i, 0x3c3c3c3cu);  // finite codes and scales (timing only)
      }
    }
    float* x = dalloc<float>((size_t)8 * s.cols);
    float* y = dalloc<float>((size_t)8 * s.rows);
    fill(x, (size_t)8 * s.cols * 4, 7, 0x3f7fffffu);
    auto run = [&](int ti, int n) {
      return time_graph(st, 32, [&](int i) {
        WeightView wv{types[ti], m[ti].w[i % m[ti].w.size()], s.rows, s.cols, m[ti].rb};
        CK(gemv(wv, x, n, y, nullptr, false, st));
      });
    };
    for (int n : {1, 2, 4, 8}) {
      say("  %-22s n=%-2d", s.name, n);
      double bf16_ms = 0;
      for (int ti = 0; ti < kTypes; ++ti) {
        const double ms = run(ti, n);
        if (ti == 0) bf16_ms = ms;
        const double gbs = ((double)m[ti].bytes + (double)n * s.cols * 4 + (double)n * s.rows * 4) / ms / 1e6;
        say(" | %7.2f (%4.1f%%)", ms * 1e3, 100.0 * gbs / ceiling);
        if (n == 1 || n == 4)
          g_summary.push_back(std::string("kquant gemv ") + names[ti] + " " + s.name +
                              " n=" + std::to_string(n) + ": " + std::to_string(ms * 1e3).substr(0, 6) +
                              " us, " + std::to_string((int)gbs) +
                              " GB/s = " + std::to_string((int)(100.0 * gbs / ceiling)) + "% of read, " +
                              std::to_string(bf16_ms / ms).substr(0, 4) + "x bf16");
      }
      say("\n");
    }
    for (int ti = 1; ti < 5; ++ti)  // x staged in shared memory against x through L1
      for (int n : {1, 2}) {
        say("  %-22s n=%d  %s", s.name, n, names[ti]);
        for (int stage : {1, 0}) {
          set_kquant_stage(stage);
          const double ms = run(ti, n);
          const double gbs =
              ((double)m[ti].bytes + (double)n * s.cols * 4 + (double)n * s.rows * 4) / ms / 1e6;
          say(" | %s %6.2f (%4.1f%%)", stage ? "x staged:" : "x via L1:", ms * 1e3, 100.0 * gbs / ceiling);
        }
        set_kquant_stage(-1);
        say("\n");
      }
    {  // int8 activations (gemv_kquant_q8: the quantisation of x included) against f32 x through L1
      uint8_t* ws = dalloc<uint8_t>(kquant_q8_ws_bytes(8, s.cols));
      for (int ti = 1; ti < 5; ++ti)
        for (int n : {1, 2, 4}) {
          say("  %-22s n=%d  %s", s.name, n, names[ti]);
          const double ms_f32 = run(ti, n);
          const double ms_q8 = time_graph(st, 32, [&](int i) {
            WeightView wv{types[ti], m[ti].w[i % m[ti].w.size()], s.rows, s.cols, m[ti].rb};
            CK(gemv_kquant_q8(wv, x, n, y, nullptr, false, ws, kquant_q8_ws_bytes(8, s.cols), st));
          });
          const double bytes = (double)m[ti].bytes + (double)n * s.cols * 4 + (double)n * s.rows * 4;
          say(" | x f32: %6.2f (%4.1f%%) | x int8: %6.2f (%4.1f%%)\n", ms_f32 * 1e3,
              100.0 * bytes / ms_f32 / 1e6 / ceiling, ms_q8 * 1e3, 100.0 * bytes / ms_q8 / 1e6 / ceiling);
          if (n == 1 || n == 4)
            g_summary.push_back(
                std::string("kquant gemv int8 x ") + names[ti] + " " + s.name + " n=" + std::to_string(n) +
                ": " + std::to_string(ms_q8 * 1e3).substr(0, 6) +
                " us = " + std::to_string((int)(100.0 * bytes / ms_q8 / 1e6 / ceiling)) +
                "% of read (f32 x: " + std::to_string((int)(100.0 * bytes / ms_f32 / 1e6 / ceiling)) + "%)");
        }
      for (int ti : {1, 2}) {
        say("  %-22s n=1  %s int8 tiles", s.name, names[ti]);
        for (int t : tiles) {
          set_kquant_tile(t);
          const double ms = time_graph(st, 32, [&](int i) {
            WeightView wv{types[ti], m[ti].w[i % m[ti].w.size()], s.rows, s.cols, m[ti].rb};
            CK(gemv_kquant_q8(wv, x, 1, y, nullptr, false, ws, kquant_q8_ws_bytes(8, s.cols), st));
          });
          const double gbs = ((double)m[ti].bytes + (double)s.cols * 4 + (double)s.rows * 4) / ms / 1e6;
          say(" | %d: %6.2f (%4.1f%%)", t, ms * 1e3, 100.0 * gbs / ceiling);
        }
        set_kquant_tile(0);
        say("\n");
      }
      CK(cudaFree(ws));
    }
    for (int ti : {1, 2}) {
      say("  %-22s n=1  %s tiles", s.name, names[ti]);
      for (int t : tiles) {
        set_kquant_tile(t);
        const double ms = run(ti, 1);
        const double gbs = ((double)m[ti].bytes + (double)s.cols * 4 + (double)s.rows * 4) / ms / 1e6;
        say(" | %d: %6.2f (%4.1f%%)", t, ms * 1e3, 100.0 * gbs / ceiling);
      }
      set_kquant_tile(0);
      say("\n");
    }
    for (auto& mm : m)
      for (auto p : mm.w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
}

// The tensor-core low-bit gemv (gemv_lowbit_tc) with the weights loaded by the lanes into registers (slots
// 0) against its bulk-copy variant (cp.async.bulk into a ring of 1-6 slots per warp), F8_E4M3 with a scale
// per row and TERNARY with one per tensor, n = 1 and 4.
void bench_lowbit_bulk(cudaStream_t st, double ceiling) {
  const std::vector<LowbitShape>& shapes = lowbit_shapes();
  const int slots[] = {0, 1, 2, 3, 4, 6};
  say("\n  lowbit tensor-core gemv, register loads (slots 0) vs bulk copies: us/call (%% of read ceiling)\n");
  say("  %-28s", "");
  for (int sl : slots) say(" | slots %d       ", sl);
  say("\n");
  for (const LowbitShape& s : shapes)
    for (GgmlType t : {GgmlType::F8_E4M3, GgmlType::TERNARY}) {
      const size_t rb = lowbit_row_bytes(t, s.cols), wbytes = (size_t)s.rows * rb;
      std::vector<uint8_t*> w;
      const int copies = (int)std::max<size_t>(2, (4 * g_dev.l2_bytes + wbytes - 1) / wbytes);
      for (int i = 0; i < copies; ++i) {
        w.push_back(dalloc<uint8_t>(wbytes));
        fill(w.back(), wbytes, 300 + i, 0x3c3c3c3cu);
      }
      float* scale = dalloc<float>((size_t)s.rows);
      fill(scale, (size_t)s.rows * 4, 9, 0x3c7fffffu);
      float* x = dalloc<float>((size_t)8 * s.cols);
      float* y = dalloc<float>((size_t)8 * s.rows);
      fill(x, (size_t)8 * s.cols * 4, 7, 0x3f7fffffu);
      const bool fp8 = t == GgmlType::F8_E4M3;
      for (int n : {1, 4}) {
        WeightView wv{t, w[0], s.rows, s.cols, rb, scale};
        wv.scale_group = s.cols, wv.scale_row_stride = fp8 ? 1 : 0;
        if (!gemv_lowbit_tc_ok(wv, n)) continue;
        say("  %-7s %-20s n=%d", fp8 ? "fp8" : "ternary", s.name, n);
        for (int sl : slots) {
          const double ms = time_graph(st, 32, [&](int i) {
            WeightView v = wv;
            v.data = w[i % w.size()];
            CK(gemv_lowbit_tc(v, x, n, y, nullptr, false, st, sl));
          });
          const double bytes =
              (double)wbytes + (fp8 ? s.rows * 4.0 : 0.0) + (double)n * s.cols * 4 + (double)n * s.rows * 4;
          say(" | %6.2f (%4.1f%%)", ms * 1e3, 100.0 * bytes / ms / 1e6 / ceiling);
          if (n == 1)
            g_summary.push_back(std::string("lowbit tc ") + (fp8 ? "fp8 " : "ternary ") + s.name +
                                " n=1 slots " + std::to_string(sl) + ": " +
                                std::to_string(ms * 1e3).substr(0, 6) + " us");
        }
        say("\n");
      }
      for (auto p : w) CK(cudaFree(p));
      CK(cudaFree(scale));
      CK(cudaFree(x));
      CK(cudaFree(y));
    }
}

// Prefill matmuls of F8_E4M3 weights (a scale per row), Llama-3-8B shapes, through CudaMatmul: the BF16 copy
// of the weights (dequantised per call) + BF16 GEMM against cuBLASLt's FP8 GEMM with x quantised per row
// (tuning::set_fp8_gemm 2 / 1), and BF16 weights as they are for reference: us per call and TFLOP/s.
void bench_fp8_gemm(cudaStream_t st) {
  struct S {
    const char* name;
    int64_t rows, cols;
  };
  const std::vector<S> shapes = {{"attn 4096x4096", 4096, 4096},
                                 {"qkv 6144x4096", 6144, 4096},
                                 {"gate_up 28672x4096", 28672, 4096},
                                 {"down 4096x14336", 4096, 14336}};
  const int max_n = 2048;
  const size_t ws_bytes = CudaMatmul::workspace_bytes(max_n, 14336, (int64_t)28672 * 4096);
  uint8_t* ws = dalloc<uint8_t>(ws_bytes);
  CudaMatmul mm;
  CK(mm.init(ws, ws_bytes));
  say("\n  prefill matmul, F8_E4M3 weights (scale per row): us/call (TFLOP/s) | bf16 weights | "
      "fp8: bf16 copy | fp8: FP8 GEMM (x per-row E4M3) | speed-up\n");
  for (const S& s : shapes) {
    const size_t n8 = (size_t)s.rows * s.cols;
    uint8_t* w8 = dalloc<uint8_t>(n8);
    fill(w8, n8, 11, 0x3c3c3c3cu);
    uint8_t* w16 = dalloc<uint8_t>(n8 * 2);
    fill(w16, n8 * 2, 12, 0x3c003c00u);
    float* scale = dalloc<float>((size_t)s.rows);
    fill(scale, (size_t)s.rows * 4, 9, 0x3c7fffffu);
    float* x = dalloc<float>((size_t)max_n * s.cols);
    fill(x, (size_t)max_n * s.cols * 4, 7, 0x3f7fffffu);
    float* y = dalloc<float>((size_t)max_n * s.rows);
    for (int n : {128, 512, 2048}) {
      say("  %-20s n=%-5d", s.name, n);
      double t[3];
      for (int v = 0; v < 3; ++v) {
        WeightView wv{v == 0 ? GgmlType::BF16 : GgmlType::F8_E4M3, v == 0 ? w16 : w8,       s.rows, s.cols,
                      (size_t)(v == 0 ? s.cols * 2 : s.cols),      v == 0 ? nullptr : scale};
        if (v > 0) wv.scale_group = s.cols, wv.scale_row_stride = 1;
        tuning::set_fp8_gemm(v == 2 ? 1 : 2);
        t[v] = time_graph(st, 4, [&](int) { CK(mm.matmul(wv, x, n, y, nullptr, false, st)); });
        say(" | %8.1f (%5.1f)", t[v] * 1e3, 2.0 * n * s.rows * s.cols / (t[v] * 1e-3) / 1e12);
      }
      tuning::set_fp8_gemm(0);
      say(" | %.2fx\n", t[1] / t[2]);
      g_summary.push_back(std::string("fp8 prefill ") + s.name + " n=" + std::to_string(n) + ": bf16 copy " +
                          std::to_string(t[1] * 1e3).substr(0, 7) + " us, fp8 gemm " +
                          std::to_string(t[2] * 1e3).substr(0, 7) + " us, bf16 weights " +
                          std::to_string(t[0] * 1e3).substr(0, 7) + " us");
    }
    for (void* p : {(void*)w8, (void*)w16, (void*)scale, (void*)x, (void*)y}) CK(cudaFree(p));
  }
  CK(cudaFree(ws));
}

int main(int argc, char** argv) {
  std::string out_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out_dir = argv[++i];
    else if (a == "--quick")
      g_quick = true;
    else if (a == "--sweep")
      g_sweep = true;
    else if (a == "--only" && i + 1 < argc)
      g_only.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--out DIR] [--quick] [--sweep] [--only SECTION]...\n", argv[0]);
      return 2;
    }
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (!out_dir.empty()) {
    const std::string path = out_dir + "/bench_cuda_kernels.txt";
    g_log = std::fopen(path.c_str(), "w");
    if (!g_log) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 2;
    }
  }
  CK(query_device(0, &g_dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  say("device: %s, %d SMs, L2 %zu MB, %zu GB\n", prop.name, g_dev.n_sms, g_dev.l2_bytes >> 20,
      prop.totalGlobalMem >> 30);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  say("\nceilings\n");
  const double ceiling = bench_read(st);
  if (section("gemv")) bench_gemv(st, ceiling);
  if (section("attention")) bench_attention(st, ceiling);
  if (section("prefill")) bench_prefill(st);
  if (section("sampler")) bench_sampler(st);
  if (section("lowbit")) bench_lowbit(st, ceiling);
  if (section("lowbit_bulk")) bench_lowbit_bulk(st, ceiling);
  if (section("kquant")) bench_kquant(st, ceiling);
  if (section("fp8_gemm")) bench_fp8_gemm(st);
  say("\nsummary\n");
  for (const auto& s : g_summary) say("  %s\n", s.c_str());
  CK(cudaStreamDestroy(st));
  if (g_log) std::fclose(g_log);
  return 0;
}
