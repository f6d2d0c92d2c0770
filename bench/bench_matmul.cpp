// Decode/prefill matmul benchmark on the shapes of a 110M-parameter Llama (dim 768, ffn 2048, 12 layers,
// vocab 32000), against this machine's measured read bandwidth.
//   bench_matmul [--threads N] [--reps R] [--bandwidth-only] [--prefill-only] [--tokens T] [--type NAME]
// --prefill-only skips the bandwidth and decode parts; --tokens sets the prefill batch (default 128);
// --type runs only that weight type (f32, f16, bf16, q8_0, f8_e4m3, ternary, as type_name() prints it).
// --bandwidth-only prints only the "read bandwidth, N thread(s): X GB/s ..." lines (1 thread, and N) and
// exits; scripts parse them with the regex `read bandwidth, N threads?: ([0-9.]+) GB/s`.
// Bandwidth: sum of a 1 GiB buffer split over the pool's threads (AVX2 loads, 4 accumulators), best of 8
// runs with plain loads and 8 with software prefetch 2 KB ahead.
// Decode: one token through the 7 matrices of each of the 12 layers plus the 32000x768 output, all laid
// out in one buffer (110M weights: 438 MB F32, 116 MB Q8_0, far beyond L3), best of R passes; reports the
// weight bytes streamed per second, % of the measured bandwidth and the implied tokens/s of the matmuls.
// Prefill: 128 tokens through the 12 layers' matrices, GFLOP/s (2 flops per weight per token).
// Types: F32, F16, BF16, Q8_0, F8_E4M3 and TERNARY (one f32 scale per row each; the scales, 0.4 MB, are not
// counted in MB).
#include <immintrin.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "core/thread_pool.h"

using namespace ultra;
using namespace ultra::cpu;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void* big_alloc(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p) {
    std::fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    std::exit(1);
  }
  return p;
}

struct BandwidthCtx {
  const float* buf;
  size_t n;
  float sums[64];
};

// One thread's share of the sum. The library is built for baseline x86-64 (its kernels pick AVX2/AVX-512 at
// run time); this loop uses AVX2 loads itself, so only this function is compiled for AVX2 (the benchmark
// needs an AVX2 machine anyway).
// With kPrefetch, each step also requests the lines 2 KB ahead (as the decode row loops do): on some Xeons
// one core's demand misses alone reach only part of what the memory delivers.
template <bool kPrefetch>
__attribute__((target("avx2"))) void sum_share(void* c, int ith, int nth) {
  BandwidthCtx& x = *(BandwidthCtx*)c;
  int64_t b, e;
  ThreadPool::split((int64_t)(x.n / 64), ith, nth, b, e);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = b * 64; i < e * 64; i += 64) {
    const float* p = x.buf + i;
    if constexpr (kPrefetch)
      for (int l = 0; l < 4; ++l) _mm_prefetch((const char*)p + 2048 + 64 * l, _MM_HINT_T0);
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_load_ps(p), _mm256_load_ps(p + 8)));
    a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_load_ps(p + 16), _mm256_load_ps(p + 24)));
    a2 = _mm256_add_ps(a2, _mm256_add_ps(_mm256_load_ps(p + 32), _mm256_load_ps(p + 40)));
    a3 = _mm256_add_ps(a3, _mm256_add_ps(_mm256_load_ps(p + 48), _mm256_load_ps(p + 56)));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  x.sums[ith] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

double measure_bandwidth(ThreadPool& pool, size_t bytes) {
  float* buf = (float*)big_alloc(bytes);
  const size_t n = bytes / sizeof(float);
  for (size_t i = 0; i < n; ++i) buf[i] = (float)(i & 1023) * 1e-3f;
  BandwidthCtx ctx{buf, n, {}};
  double best = 1e30;
  for (int rep = 0; rep < 16; ++rep) {  // plain and prefetched loads alternated, the best of either
    const double t0 = now();
    pool.run(rep % 2 ? sum_share<true> : sum_share<false>, &ctx);
    best = std::min(best, now() - t0);
  }
  float s = 0;
  for (int i = 0; i < pool.size(); ++i) s += ctx.sums[i];
  if (s == 12345.0f) std::printf(" ");  // keep the sums alive
  std::free(buf);
  return (double)bytes / best / 1e9;
}

struct Shape {
  int64_t rows, cols;
};

constexpr int kDim = 768, kFfn = 2048, kLayers = 12, kVocab = 32000;
// One layer: q, k, v, o (dim x dim), gate, up (ffn x dim), down (dim x ffn).
const Shape kLayer[7] = {{kDim, kDim}, {kDim, kDim}, {kDim, kDim}, {kDim, kDim},
                         {kFfn, kDim}, {kFfn, kDim}, {kDim, kFfn}};

size_t rb_of(GgmlType t, int64_t cols) {
  switch (t) {
    case GgmlType::F32:
      return cols * 4;
    case GgmlType::F16:
    case GgmlType::BF16:
      return cols * 2;
    case GgmlType::F8_E4M3:
      return cols;
    case GgmlType::TERNARY:
      return cols / 16 * 4;
    default:
      return cols / 32 * sizeof(BlockQ8_0);
  }
}

struct Model {
  uint8_t* buf = nullptr;
  size_t bytes = 0;
  std::vector<WeightView> mats;  // 12 * 7 + output
  std::vector<float> scales;     // F8_E4M3 / TERNARY: one per row of every matrix
};

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,     GgmlType::BF16,
                           GgmlType::Q8_0, GgmlType::F8_E4M3, GgmlType::TERNARY};

Model build_model(GgmlType t) {
  Model m;
  std::vector<Shape> shapes;
  for (int l = 0; l < kLayers; ++l)
    for (const Shape& s : kLayer) shapes.push_back(s);
  shapes.push_back({kVocab, kDim});
  for (const Shape& s : shapes) m.bytes += s.rows * rb_of(t, s.cols);
  m.buf = (uint8_t*)big_alloc(m.bytes);
  // Plausible values (no NaN/denormals): small floats, Q8_0 scale 0.01.
  uint32_t seed = 12345;
  auto rnd = [&]() { return seed = seed * 1664525u + 1013904223u; };
  const size_t n16 = m.bytes / 2;
  uint16_t* p16 = (uint16_t*)m.buf;
  if (t == GgmlType::F32) {
    float* p = (float*)m.buf;
    for (size_t i = 0; i < m.bytes / 4; ++i) p[i] = ((int)(rnd() >> 16) % 2001 - 1000) * 1e-5f;
  } else if (t == GgmlType::F16) {
    for (size_t i = 0; i < n16; ++i) p16[i] = fp32_to_fp16(((int)(rnd() >> 16) % 2001 - 1000) * 1e-5f);
  } else if (t == GgmlType::BF16) {
    for (size_t i = 0; i < n16; ++i) p16[i] = fp32_to_bf16(((int)(rnd() >> 16) % 2001 - 1000) * 1e-5f);
  } else if (t == GgmlType::F8_E4M3) {
    for (size_t i = 0; i < m.bytes; ++i) {
      const uint8_t c = (uint8_t)(rnd() >> 16);
      m.buf[i] = (c & 0x7f) == 0x7f ? 0 : c;  // no NaN codes
    }
  } else if (t == GgmlType::TERNARY) {
    uint32_t* w = (uint32_t*)m.buf;
    for (size_t i = 0; i < m.bytes / 4; ++i) {
      uint32_t v = 0;
      for (int k = 0; k < 16; ++k) v |= ((rnd() >> 16) % 3) << (2 * k);
      w[i] = v;
    }
  } else {
    BlockQ8_0* b = (BlockQ8_0*)m.buf;
    for (size_t i = 0; i < m.bytes / sizeof(BlockQ8_0); ++i) {
      b[i].d = fp32_to_fp16(0.01f);
      for (int j = 0; j < 32; ++j) b[i].qs[j] = (int8_t)((int)(rnd() >> 16) % 255 - 127);
    }
  }
  size_t total_rows = 0;
  for (const Shape& s : shapes) total_rows += s.rows;
  const bool scaled = t == GgmlType::F8_E4M3 || t == GgmlType::TERNARY;
  if (scaled) m.scales.assign(total_rows, 0.01f);
  size_t off = 0, row0 = 0;
  for (const Shape& s : shapes) {
    WeightView w{t, m.buf + off, s.rows, s.cols, rb_of(t, s.cols)};
    if (scaled) {
      w.scale = m.scales.data() + row0;
      w.scale_group = s.cols;
      w.scale_row_stride = 1;
    }
    m.mats.push_back(w);
    off += s.rows * rb_of(t, s.cols);
    row0 += s.rows;
  }
  return m;
}

// One decode token (x fixed; only the matmuls) or a prefill batch of nt tokens (no output matrix).
void forward(ThreadPool& pool, const Model& m, int nt, bool with_output, std::vector<float>& x,
             std::vector<float>& y, std::vector<float>& scratch) {
  const size_t n = m.mats.size() - (with_output ? 0 : 1);
  for (size_t i = 0; i < n; ++i) matmul(pool, m.mats[i], x.data(), nt, y.data(), nullptr, scratch.data());
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20, prefill_tokens = 128;
  bool bandwidth_only = false, prefill_only = false;
  std::string only_type;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--bandwidth-only")
      bandwidth_only = true;
    else if (a == "--prefill-only")
      prefill_only = true;
    else if (a == "--tokens" && i + 1 < argc)
      prefill_tokens = std::max(1, std::atoi(argv[++i]));
    else if (a == "--type" && i + 1 < argc)
      only_type = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--reps R] [--bandwidth-only] [--prefill-only] [--tokens T] "
                   "[--type NAME]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<int> tcounts = {1};
  if (threads != 1) tcounts.push_back(threads);

  if (!bandwidth_only)
    std::printf("kernels: %s%s\n", detail::matmul_kernels().name,
                detail::q8_int8_enabled() ? "; Q8_0 with int8 activations (VNNI; ULTRA_Q8_INT8=0: f32)" : "");
  auto skip_type = [&](GgmlType t) {
    if (only_type.empty()) return false;
    std::string n(type_name(t));
    for (char& c : n) c = (char)std::tolower((unsigned char)c);
    return n != only_type;
  };
  std::vector<double> bw(tcounts.size());
  for (size_t i = 0; i < tcounts.size() && !prefill_only; ++i) {
    ThreadPool pool(tcounts[i]);
    bw[i] = measure_bandwidth(pool, 1ull << 30);
    std::printf("read bandwidth, %d thread%s: %.1f GB/s (1 GiB sum, best of 16)\n", tcounts[i],
                tcounts[i] > 1 ? "s" : "", bw[i]);
    std::fflush(stdout);
  }
  if (bandwidth_only) return 0;

  const int kPrefill = prefill_tokens;
  std::vector<float> x((size_t)kPrefill * kFfn), y((size_t)kPrefill * kVocab);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7919) % 2001) * 1e-3f - 1.0f;
  size_t n_scratch = 1;
  for (GgmlType t : kTypes)
    n_scratch =
        std::max(n_scratch, matmul_scratch_floats(WeightView{t, nullptr, kVocab, kFfn, rb_of(t, kFfn)},
                                                  kPrefill, std::max(threads, 1)));
  std::vector<float> scratch(n_scratch);

  if (!prefill_only) {
    std::printf("\ndecode: 12 layers x 7 matrices + 32000x768 output, one token, best of %d\n", reps);
    std::printf("%-7s %7s %3s %9s %8s %8s %9s\n", "type", "MB", "thr", "ms/token", "GB/s", "%bw", "tok/s");
    for (GgmlType t : kTypes) {
      if (skip_type(t)) continue;
      Model m = build_model(t);
      for (size_t i = 0; i < tcounts.size(); ++i) {
        ThreadPool pool(tcounts[i]);
        forward(pool, m, 1, true, x, y, scratch);  // warm-up
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          const double t0 = now();
          forward(pool, m, 1, true, x, y, scratch);
          best = std::min(best, now() - t0);
        }
        const double gbs = m.bytes / best / 1e9;
        std::printf("%-7s %7.1f %3d %9.3f %8.1f %7.1f%% %9.1f\n", std::string(type_name(t)).c_str(),
                    m.bytes / 1e6, tcounts[i], best * 1e3, gbs, 100.0 * gbs / bw[i], 1.0 / best);
      }
      std::free(m.buf);
    }
  }

  std::printf("\nprefill: %d tokens through the 12 layers' 84 matrices (no output), best of 3\n", kPrefill);
  std::printf("%-7s %3s %9s %9s\n", "type", "thr", "ms", "GFLOP/s");
  for (GgmlType t : kTypes) {
    if (skip_type(t)) continue;
    Model m = build_model(t);
    double flops = 0;
    for (size_t i = 0; i + 1 < m.mats.size(); ++i) flops += 2.0 * m.mats[i].rows * m.mats[i].cols * kPrefill;
    for (size_t i = 0; i < tcounts.size(); ++i) {
      ThreadPool pool(tcounts[i]);
      double best = 1e30;
      for (int r = 0; r < 3; ++r) {
        const double t0 = now();
        forward(pool, m, kPrefill, false, x, y, scratch);
        best = std::min(best, now() - t0);
      }
      std::printf("%-7s %3d %9.1f %9.1f\n", std::string(type_name(t)).c_str(), tcounts[i], best * 1e3,
                  flops / best / 1e9);
    }
    std::free(m.buf);
  }
  return 0;
}
