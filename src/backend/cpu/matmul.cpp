// matmul: scalar reference (also the kernel set of CPUs without AVX2), run-time kernel choice, threading.
// The SIMD kernels are in matmul_avx2.cpp (AVX2+FMA+F16C) and matmul_avx512.cpp (wider registers, masked
// tails); the driver they share, which walks rows and tokens, is matmul_driver.h.
//
// Structure of every kernel: a tile of R weight rows x T tokens keeps R*T vector accumulators; each step
// loads one vector of each of the R rows once (converting F16/BF16/Q8_0 to f32) and FMAs it against the T
// token vectors. Decode (T = 1) reads one row at a time (one sequential stream per thread) with four
// independent accumulator chains to hide the FMA latency; prefill walks the tokens in tiles of T for every
// row tile, so the R rows (a few KiB) are read from DRAM once and then reused from L1 for all tokens of
// the chunk. Steps of 16 tokens or more take the packed-panel GEMM instead (matmul_panel_avx2.h,
// matmul_panel_avx512.h): weights converted to f32 once per 16/32-row x 256-column panel, k-major, and an
// outer-product micro-kernel (rows as vector lanes, tokens broadcast) that is FMA-bound with no horizontal
// sums (~1.5-2x the tiles' rate, docs/BENCHMARKS.md; ULTRA_CPU_PANEL=0 turns it off for A/B runs). Rows are
// handed to threads in chunks from a shared counter (see matmul()).
//
// Q8_0: the weights are dequantised in registers (int8 -> int32 -> f32, times the block's f16 scale d) and
// FMA'd against the f32 activations exactly like the float types. q * d (|q| <= 127, d with an 11-bit
// significand) is exact in f32, so the kernels compute the same f32 dot product as an F32 matrix holding the
// dequantised weights: the only error is f32 accumulation rounding (no activation quantisation). The
// conversion (4 vector ops per 8/16 weights) caps one core at ~27 G weights/s in cache (~29 GB/s of Q8_0;
// AVX-512 on Zen 5 at 3.2 GHz, AVX2 ~19 G/s), about one core's DRAM read bandwidth, so decode with 2+
// threads is memory-bound; prefill amortises it over the token tile.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "core/fp8.h"
#include "core/quants.h"
#include "core/ternary.h"

namespace ultra::cpu {

using detail::MatmulArgs;
using detail::MatmulKernels;

namespace {

[[noreturn]] void unsupported(const char* what, GgmlType t) {
  std::fprintf(stderr, "ultra: %s: unsupported weight type %s\n", what, std::string(type_name(t)).c_str());
  std::abort();
}

// ---- reference helpers ----

inline double weight_at(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
  switch (w.type) {
    case GgmlType::F32:
      return ((const float*)row)[c];
    case GgmlType::F16:
      return fp16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::BF16:
      return bf16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::Q8_0: {
      const BlockQ8_0& b = ((const BlockQ8_0*)row)[c / kQ8_0Block];
      return (double)fp16_to_fp32(b.d) * b.qs[c % kQ8_0Block];
    }
    case GgmlType::F8_E4M3:
      return (double)fp8_e4m3_to_fp32(row[c]) * w.scale[r * w.scale_row_stride + c / w.scale_group];
    case GgmlType::TERNARY:
      return (double)ternary_trit(((const uint32_t*)row)[c / kTernaryPerWord], (int)(c % kTernaryPerWord)) *
             w.scale[r * w.scale_row_stride + c / w.scale_group];
    default:
      unsupported("matmul_ref", w.type);
  }
}

// Row r of a block type (detail::block_kind) times x, x[c] given by xv(c): each block dequantised exactly
// (core/quants.h) into a stack buffer, its values accumulated in double like weight_at's (+ bias[r]).
template <class X>
float dot_row_blocks_ref(GgmlType t, const uint8_t* row, int64_t cols, X xv, const float* bias, int64_t r) {
  const auto tt = type_traits(t);
  const int64_t qk = tt->block_elems, nb = cols / qk;
  float v[kQK_K];
  double s = 0;
  for (int64_t b = 0; b < nb; ++b) {
    dequantize(t, row + b * tt->block_bytes, qk, v);
    for (int64_t i = 0; i < qk; ++i) s += (double)v[i] * xv(b * qk + i);
  }
  if (bias) s += bias[r];
  return (float)s;
}

void ref_rows_blocks(const WeightView& w, const float* x, int n_tokens, float* y, const float* bias,
                     int64_t r0, int64_t r1) {
  for (int t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * w.cols;
    for (int64_t r = r0; r < r1; ++r)
      y[t * w.rows + r] = dot_row_blocks_ref(
          w.type, (const uint8_t*)w.data + r * w.row_bytes, w.cols, [xt](int64_t c) { return (double)xt[c]; },
          bias, r);
  }
}

// matmul_ref's arithmetic (double accumulation) for rows [r0, r1) of every token.
void ref_rows(const WeightView& w, const float* x, int n_tokens, float* y, const float* bias, int64_t r0,
              int64_t r1) {
  if (detail::block_kind(w.type) >= 0) return ref_rows_blocks(w, x, n_tokens, y, bias, r0, r1);
  for (int t = 0; t < n_tokens; ++t) {
    for (int64_t r = r0; r < r1; ++r) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += weight_at(w, r, c) * (double)x[t * w.cols + c];
      if (bias) s += bias[r];
      y[t * w.rows + r] = (float)s;
    }
  }
}

// The scalar kernel set: the reference on the rows a thread claims (the fallback on CPUs without AVX2,
// and under ULTRA_NO_SIMD=1).
template <GgmlType T>
void range_scalar(const MatmulArgs& a, int64_t r0, int64_t r1) {
  ref_rows(WeightView{T, a.w, a.rows, a.cols, a.row_bytes, a.scale, a.scale_group, a.scale_row_stride}, a.x,
           a.n_tokens, a.y, a.bias, r0, r1);
}

const MatmulKernels* g_override = nullptr;

}  // namespace

namespace detail {

int block_kind(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
      return kQ4_0;
    case GgmlType::Q4_1:
      return kQ4_1;
    case GgmlType::Q5_0:
      return kQ5_0;
    case GgmlType::Q5_1:
      return kQ5_1;
    case GgmlType::Q2_K:
      return kQ2_K;
    case GgmlType::Q3_K:
      return kQ3_K;
    case GgmlType::Q4_K:
      return kQ4_K;
    case GgmlType::Q5_K:
      return kQ5_K;
    case GgmlType::Q6_K:
      return kQ6_K;
    case GgmlType::IQ4_NL:
      return kIQ4_NL;
    case GgmlType::IQ4_XS:
      return kIQ4_XS;
    case GgmlType::MXFP4:
      return kMXFP4;
    default:
      return -1;
  }
}

const MatmulKernels& matmul_kernels_scalar() {
  static const MatmulKernels k{
      range_scalar<GgmlType::F32>,
      range_scalar<GgmlType::F16>,
      range_scalar<GgmlType::BF16>,
      range_scalar<GgmlType::Q8_0>,
      range_scalar<GgmlType::F8_E4M3>,
      range_scalar<GgmlType::TERNARY>,
      "scalar",
      nullptr,
      0,
      0,
      BlockKernelTable{
          range_scalar<GgmlType::Q4_0>, range_scalar<GgmlType::Q4_1>, range_scalar<GgmlType::Q5_0>,
          range_scalar<GgmlType::Q5_1>, range_scalar<GgmlType::Q2_K>, range_scalar<GgmlType::Q3_K>,
          range_scalar<GgmlType::Q4_K>, range_scalar<GgmlType::Q5_K>, range_scalar<GgmlType::Q6_K>,
          range_scalar<GgmlType::IQ4_NL>, range_scalar<GgmlType::IQ4_XS>, range_scalar<GgmlType::MXFP4>}};
  return k;
}

void quantize_x_q8_ref(const float* x, int64_t cols, int8_t* xq, float* xd) {
  for (int64_t b = 0; b < cols / kQ8_0Block; ++b) {
    const float* xb = x + b * kQ8_0Block;
    float m = 0;
    for (int i = 0; i < kQ8_0Block; ++i) m = std::max(m, std::fabs(xb[i]));
    xd[b] = m / 127.0f;
    const float id = m > 0 ? 127.0f / m : 0.0f;
    for (int i = 0; i < kQ8_0Block; ++i) xq[b * kQ8_0Block + i] = (int8_t)std::nearbyint(xb[i] * id);
  }
}

void matmul_q8_int8_ref(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const BlockQ8_0* b = (const BlockQ8_0*)(a.w + r * a.row_bytes);
    double s = 0;
    for (int64_t k = 0; k < a.cols / kQ8_0Block; ++k) {
      int32_t dot = 0;
      for (int i = 0; i < kQ8_0Block; ++i) dot += b[k].qs[i] * a.xq[k * kQ8_0Block + i];
      s += (double)fp16_to_fp32(b[k].d) * a.xd[k] * dot;
    }
    if (a.bias) s += a.bias[r];
    a.y[r] = (float)s;
  }
}

MatmulRangeFn kquant_int8_vnni(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K:
      return matmul_q4k_int8_vnni;
    case GgmlType::Q6_K:
      return matmul_q6k_int8_vnni;
    case GgmlType::IQ4_XS:
      return matmul_iq4xs_int8_vnni;
    case GgmlType::Q5_K:
      return matmul_q5k_int8_vnni;
    case GgmlType::Q4_0:
      return matmul_b32_int8_vnni<GgmlType::Q4_0, BlockQ4_0>;
    case GgmlType::Q4_1:
      return matmul_b32_int8_vnni<GgmlType::Q4_1, BlockQ4_1>;
    case GgmlType::Q5_0:
      return matmul_b32_int8_vnni<GgmlType::Q5_0, BlockQ5_0>;
    case GgmlType::Q5_1:
      return matmul_b32_int8_vnni<GgmlType::Q5_1, BlockQ5_1>;
    case GgmlType::IQ4_NL:
      return matmul_b32_int8_vnni<GgmlType::IQ4_NL, BlockIQ4_NL>;
    default:
      return nullptr;
  }
}

void matmul_kquant_int8_ref(GgmlType t, const MatmulArgs& a, int64_t r0, int64_t r1) {
  auto xv = [&a](int64_t c) { return (double)a.xq[c] * a.xd[c / kQ8_0Block]; };
  for (int64_t r = r0; r < r1; ++r)
    a.y[r] = dot_row_blocks_ref(t, a.w + r * a.row_bytes, a.cols, xv, a.bias, r);
}

void x_sums_q8(const int8_t* xq, int64_t cols, float* xs16, float* xs32) {
  for (int64_t k = 0; k < cols / 16; ++k) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += xq[16 * k + i];
    xs16[k] = (float)s;
    if (k % 2) xs32[k / 2] = xs16[k - 1] + xs16[k];
  }
}

const MatmulKernels& matmul_kernels() {
  static const MatmulKernels& k = []() -> const MatmulKernels& {
    switch (active_isa()) {
      case Isa::Avx512:
        return matmul_kernels_avx512();
      case Isa::Avx2:
        return matmul_kernels_avx2();
      case Isa::Scalar:
        break;
    }
    return matmul_kernels_scalar();
  }();
  return k;
}

bool panel_gemm_enabled() {
  return cpu_tuning().panel_gemm;
}

void set_matmul_kernels_override(const MatmulKernels* k) {
  g_override = k;
}

}  // namespace detail

const char* kernel_isa() {
  return detail::isa_name(detail::active_isa());
}

bool q8_int8_activations() {
  return detail::q8_int8_enabled();
}

namespace {

const MatmulKernels& active_kernels() {
  return g_override ? *g_override : detail::matmul_kernels();
}

// Whether a step of n_tokens through w takes the kernels' packed-panel GEMM (matmul_driver.h's range_f).
bool takes_panel(const MatmulKernels& k, const WeightView& w, int n_tokens) {
  const bool type_ok = w.type == GgmlType::F32 || w.type == GgmlType::F16 || w.type == GgmlType::BF16 ||
                       w.type == GgmlType::Q8_0 || detail::block_kind(w.type) >= 0;
  return type_ok && k.pack_x && k.panel_min_tokens > 0 && n_tokens >= k.panel_min_tokens &&
         detail::panel_gemm_enabled();
}

// The packed x of the panel GEMM (MatmulArgs::xp): whole token tiles of every column, 64-byte aligned.
size_t packed_x_floats(const MatmulKernels& k, const WeightView& w, int n_tokens) {
  const int64_t tiles = (n_tokens + k.panel_nr - 1) / k.panel_nr;
  return (size_t)(tiles * k.panel_nr * w.cols) + 16;
}

// Whether a decode step through w takes the int8-activation Q8_0 kernel (cpu_internal.h's q8_int8_enabled();
// not under a kernel-set override, which tests use to run one set's kernels).
bool takes_q8_int8(const WeightView& w) {
  return w.type == GgmlType::Q8_0 && !g_override && detail::q8_int8_enabled();
}
// Whether a decode step through w takes an int8-activation k-quant kernel (same conditions; one token).
bool takes_kquant_int8(const WeightView& w, int n_tokens) {
  return n_tokens == 1 && detail::kquant_int8_vnni(w.type) && !g_override && detail::q8_int8_enabled();
}

// Its quantised x in the scratch: cols int8 from a 64-byte boundary, then the cols / 32 f32 scales from the
// next one.
inline int64_t round64(int64_t n) {
  return (n + 63) / 64 * 64;
}
size_t q8_int8_floats(const WeightView& w, int n_tokens) {
  const size_t decode = (size_t)(round64(w.cols) + round64(w.cols / kQ8_0Block * 4) + 64) / 4;
  // prefill: the packed token tiles (pack_x_q8_vnni)
  const int64_t tiles = (n_tokens + detail::kQ8NT - 1) / detail::kQ8NT;
  const size_t prefill = (size_t)(tiles * (w.cols / kQ8_0Block) * detail::kQ8TileBlockBytes + 64) / 4;
  return std::max(decode, prefill);
}
// The k-quant decode's x in the scratch, in bytes from its 64-byte boundary, each part 64-byte aligned: xq
// (cols int8), xd (cols / 32 f32), xs16 (cols / 16 f32), xs32 (cols / 32 f32), then the end.
struct KquantLayout {
  int64_t xd, xs16, xs32, end;
};
KquantLayout kquant_layout(int64_t cols) {
  KquantLayout l;
  l.xd = round64(cols);
  l.xs16 = l.xd + round64(cols / kQ8_0Block * 4);
  l.xs32 = l.xs16 + round64(cols / 16 * 4);
  l.end = l.xs32 + round64(cols / 32 * 4);
  return l;
}
size_t kquant_int8_floats(const WeightView& w) {
  return (size_t)(kquant_layout(w.cols).end + 64) / 4;
}

}  // namespace

// The panel GEMM's packed x, or the int8-activation decode kernel's quantised x (the other kernels read f32
// activations directly).
size_t matmul_scratch_floats(const WeightView& w, int n_tokens, int) {
  const MatmulKernels& k = active_kernels();
  const size_t panel = takes_panel(k, w, n_tokens) ? packed_x_floats(k, w, n_tokens) : 0;
  if (takes_kquant_int8(w, n_tokens)) return std::max(panel, kquant_int8_floats(w));
  return takes_q8_int8(w) ? std::max(panel, q8_int8_floats(w, n_tokens)) : panel;
}

namespace {

struct MatmulCtx {
  MatmulArgs a;
  detail::MatmulRangeFn fn;
  int64_t chunk;              // rows per work item
  int64_t row_chunks;         // ceil(rows / chunk)
  int tok_step;               // tokens per work item (the last one takes the rest)
  int tok_chunks;             // n_tokens / tok_step
  int panel_nr;               // the packed x's token tile (a.xp)
  int64_t q8_tile_bytes = 0;  // int8 prefill: bytes of a token tile of the packed x (a.xq)
  // The next unclaimed work item: row chunk + row_chunks * token chunk.
  alignas(64) std::atomic<int64_t> next{0};
};

// Rows are handed out in chunks from a shared counter (about 8 per thread, multiples of 16 rows so that
// threads never share a cache line of y): a thread that gets descheduled on a busy machine only delays
// its current chunk instead of a fixed 1/nth of the matrix, and each chunk is one sequential stream.
// Prefill chunks are at least kPrefillChunk rows, the packed-panel GEMM's L2 row block (kMC): every chunk
// streams the packed x of all its tokens once per column block, so shorter chunks read x more often. (When
// each chunk also packed x itself, 48-row chunks of a 768-row matrix cost ~12% on 2 threads; x is now
// packed once per matmul and that figure has not been re-measured. The token split below keeps threads
// busy on short matrices instead.)
constexpr int64_t kPrefillChunk = 128;
inline int64_t chunk_rows(int64_t rows, int nth, int n_tokens) {
  if (nth == 1) return rows;
  int64_t c = rows / (8 * nth);
  c = (c + 15) / 16 * 16;
  if (n_tokens >= 16) c = std::max(c, kPrefillChunk);
  return std::clamp<int64_t>(c, 16, 512);
}

// Prefill of a matrix with fewer row chunks than 2 per thread (768 rows are 6 chunks of 128: on 16 threads
// 10 would idle) also cuts the tokens, into steps of whole token tiles (a multiple of 12: of every panel_nr
// and of the tiles' 4 tokens) of at least kMinTokenStep, the last step taking the rest (less than 2 steps).
// Every step then takes the same kernel path as the whole batch (>= 16 tokens: the panel GEMM) and every
// output the same arithmetic, so results do not depend on the thread count.
constexpr int kMinTokenStep = 48;
inline int token_step(int64_t row_chunks, int nth, int n_tokens) {
  if (nth == 1 || row_chunks >= 2 * nth || n_tokens < 2 * kMinTokenStep) return n_tokens;
  const int64_t want = (2 * nth + row_chunks - 1) / row_chunks;  // token steps for ~2 items per thread
  const int64_t step = n_tokens / want / 12 * 12;                // rounded down: n_tokens / step >= want
  return (int)std::max<int64_t>(step, kMinTokenStep);
}

}  // namespace

void matmul(ThreadPool& pool, const WeightView& w, const float* x, int n_tokens, float* y, const float* bias,
            float* scratch) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  const MatmulKernels& k = active_kernels();
  MatmulCtx ctx;
  ctx.a = MatmulArgs{(const uint8_t*)w.data, w.row_bytes,       w.rows, w.cols, x, n_tokens, y, bias, w.scale,
                     w.scale_group,          w.scale_row_stride};
  ctx.chunk = chunk_rows(w.rows, pool.size(), n_tokens);
  ctx.row_chunks = (w.rows + ctx.chunk - 1) / ctx.chunk;
  ctx.tok_step = token_step(ctx.row_chunks, pool.size(), n_tokens);
  ctx.tok_chunks = n_tokens / ctx.tok_step;
  ctx.panel_nr = k.panel_nr;
  switch (w.type) {
    case GgmlType::F32:
      ctx.fn = k.f32;
      break;
    case GgmlType::F16:
      ctx.fn = k.f16;
      break;
    case GgmlType::BF16:
      ctx.fn = k.bf16;
      break;
    case GgmlType::Q8_0:
      ctx.fn = k.q8_0;
      break;
    case GgmlType::F8_E4M3:
      ctx.fn = k.fp8;
      break;
    case GgmlType::TERNARY:
      ctx.fn = k.ternary;
      break;
    default: {
      const int bk = detail::block_kind(w.type);
      if (bk < 0 || !k.blocks.fn[bk]) unsupported("matmul", w.type);
      ctx.fn = k.blocks.fn[bk];
    }
  }
  // Scratch from a 64-byte boundary (matmul_scratch_floats counts the slack).
  uint8_t* const scratch64 = (uint8_t*)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  if (scratch && takes_kquant_int8(w, n_tokens)) {
    // Decode of the block types of kquant_int8_vnni with int8 activations: x quantised and summed once, here.
    const KquantLayout l = kquant_layout(w.cols);
    int8_t* xq = (int8_t*)scratch64;
    float* xd = (float*)(scratch64 + l.xd);
    float* xs16 = (float*)(scratch64 + l.xs16);
    float* xs32 = (float*)(scratch64 + l.xs32);
    const bool ref = detail::q8_int8_reference();
    (ref ? detail::quantize_x_q8_ref : detail::quantize_x_q8_vnni)(x, w.cols, xq, xd);
    detail::x_sums_q8(xq, w.cols, xs16, xs32);
    ctx.a.xq = xq;
    ctx.a.xd = xd;
    ctx.a.xs16 = xs16;
    ctx.a.xs32 = xs32;
    if (ref) return detail::matmul_kquant_int8_ref(w.type, ctx.a, 0, w.rows);
    ctx.fn = detail::kquant_int8_vnni(w.type);
  }
  const bool q8_int8 = scratch && takes_q8_int8(w);
  if (q8_int8 && detail::q8_int8_reference()) {
    // Tests: the scalar int8 kernels, token by token, on this thread (the decode scratch serves each token).
    int8_t* xq = (int8_t*)scratch64;
    float* xd = (float*)(xq + round64(w.cols));
    MatmulArgs a = ctx.a;
    a.n_tokens = 1;
    a.xq = xq;
    a.xd = xd;
    for (int t = 0; t < n_tokens; ++t) {
      a.x = x + (int64_t)t * w.cols;
      a.y = y + (int64_t)t * w.rows;
      detail::quantize_x_q8_ref(a.x, w.cols, xq, xd);
      detail::matmul_q8_int8_ref(a, 0, w.rows);
    }
    return;
  }
  if (q8_int8 && n_tokens == 1) {
    // Decode through Q8_0 with int8 activations: x quantised once, here.
    int8_t* xq = (int8_t*)scratch64;
    float* xd = (float*)(xq + round64(w.cols));
    detail::quantize_x_q8_vnni(x, w.cols, xq, xd);
    ctx.a.xq = xq;
    ctx.a.xd = xd;
    ctx.fn = detail::matmul_q8_int8_vnni;
  } else if (q8_int8) {
    // Prefill: x quantised and packed once, the threads sharing the token tiles.
    struct Pack {
      const float* x;
      int n_tokens;
      int64_t cols;
      uint8_t* xp;
    } pk{x, n_tokens, w.cols, scratch64};
    pool.run(
        [](void* c, int ith, int nth) {
          const auto& p = *(const Pack*)c;
          const int tiles = (p.n_tokens + detail::kQ8NT - 1) / detail::kQ8NT;
          detail::pack_x_q8_vnni(p.x, p.n_tokens, p.cols, tiles * ith / nth, tiles * (ith + 1) / nth, p.xp);
        },
        &pk);
    ctx.a.xq = (const int8_t*)scratch64;
    ctx.fn = detail::matmul_q8_int8_gemm_vnni;
    ctx.q8_tile_bytes = w.cols / kQ8_0Block * detail::kQ8TileBlockBytes;
  }
  // The panel GEMM's x packed once, all threads sharing the token tiles, before any row block needs it.
  if (scratch && takes_panel(k, w, n_tokens) && !q8_int8) {
    float* xp = (float*)scratch64;
    struct Pack {
      const MatmulKernels* k;
      const float* x;
      int n_tokens;
      int64_t cols;
      float* xp;
    } pk{&k, x, n_tokens, w.cols, xp};
    pool.run(
        [](void* c, int ith, int nth) {
          const auto& p = *(const Pack*)c;
          const int tiles = (p.n_tokens + p.k->panel_nr - 1) / p.k->panel_nr;
          p.k->pack_x(p.x, p.n_tokens, p.cols, tiles * ith / nth, tiles * (ith + 1) / nth, p.xp);
        },
        &pk);
    ctx.a.xp = xp;
  }
  pool.run(
      [](void* c, int ith, int nth) {
        auto& m = *(MatmulCtx*)c;
        const int64_t items = m.row_chunks * m.tok_chunks;
        for (;;) {
          const int64_t item = m.next.fetch_add(1, std::memory_order_relaxed);
          if (item >= items) break;
          const int64_t r0 = item % m.row_chunks * m.chunk;
          const int tc = (int)(item / m.row_chunks);
          // Tokens [t0, t1): x, y and the packed x (whole tiles: t0 is a multiple of 12) from there.
          const int t0 = tc * m.tok_step, t1 = tc + 1 == m.tok_chunks ? m.a.n_tokens : t0 + m.tok_step;
          MatmulArgs a = m.a;
          a.x += (int64_t)t0 * a.cols;
          a.y += (int64_t)t0 * a.rows;
          a.n_tokens = t1 - t0;
          if (a.xp) a.xp += (int64_t)(t0 / m.panel_nr) * a.cols * m.panel_nr;
          if (m.q8_tile_bytes) a.xq += (int64_t)(t0 / detail::kQ8NT) * m.q8_tile_bytes;  // 12 | t0, 6 | 12
          m.fn(a, r0, std::min(r0 + m.chunk, m.a.rows));
        }
      },
      &ctx);
}

void matmul_ref(const WeightView& w, const float* x, int n_tokens, float* y, const float* bias) {
  ref_rows(w, x, n_tokens, y, bias, 0, w.rows);
}

}  // namespace ultra::cpu
