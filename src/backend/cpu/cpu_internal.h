// Private details shared by the CPU kernel files (not part of the ops.h interface).
//
// Instruction sets. Only the files named *_avx2.cpp and *_avx512.cpp are compiled with SIMD flags
// (CMakeLists.txt: ULTRA_AVX2_ISA = -mavx2 -mfma -mf16c; ULTRA_AVX512_ISA = those plus -mavx512f
// -mavx512bw -mavx512vl -mavx512dq); everything else is built for baseline x86-64, so the binary starts on
// any x86-64 CPU. The public kernels in ops.h choose at run time (active_isa()) between the SIMD code and
// the scalar references. Code compiled with different -m flags must never be shared through an inline
// function or template with external linkage (the linker keeps one copy, perhaps the AVX-512 one, for all
// callers): the SIMD files keep their helpers in anonymous namespaces (or static), instantiate the shared
// matmul driver (matmul_driver.h) only with types from their anonymous namespace, and call no inline
// function of a shared header (core/dtype.h's conversions are static inline for that reason).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/tuning.h"
#include "core/dtype.h"
#include "core/views.h"

namespace ultra {
class ThreadPool;
}

namespace ultra::cpu::detail {

enum class Isa : uint8_t {
  Scalar,  // the *_ref kernels (and scalar versions of the threaded ones)
  Avx2,    // AVX2 + FMA + F16C
  Avx512,  // the AVX2 set plus AVX-512 F/BW/VL/DQ (matmul and attention; the other ops use their AVX2 code)
};
const char* isa_name(Isa isa);
// Whether this CPU (and the OS, which must save the wider registers) supports exactly the features the
// files of that level are compiled with. Checked with CPUID/XGETBV, cached.
bool cpu_supports(Isa isa);
// The level the kernels use: the best supported one, lowered by ULTRA_NO_SIMD=1 (scalar) or
// ULTRA_NO_AVX512=1 (AVX2 at most). Read once, on first use.
Isa active_isa();
// (Inline helpers in this header are static: each file, whatever its flags, keeps its own copy.)
static inline bool use_avx2() {
  return active_isa() != Isa::Scalar;
}

// Everything a matmul range kernel needs. y[t * rows + r] for t < n_tokens, r in [r0, r1).
struct MatmulArgs {
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows;
  int64_t cols;
  const float* x;  // [n_tokens, cols]
  int n_tokens;
  float* y;
  const float* bias;
  // F8_E4M3 / TERNARY (WeightView's scales): row r, column group g has scale[r * scale_row_stride + g]
  const float* scale = nullptr;
  int64_t scale_group = 0;
  int64_t scale_row_stride = 0;
  // The packed-panel GEMM's x, packed once per matmul by MatmulKernels::pack_x (nullptr: each row block
  // packs its token tiles itself): token tile j (panel_nr tokens, zero past n_tokens), column k at
  // xp[(j * cols + k) * panel_nr + t].
  const float* xp = nullptr;
  // Q8_0 with int8 activations (q8_int8_enabled()): decode, x quantised per 32-column block by
  // quantize_x_q8_*(), x[c] ~ xq[c] * xd[c / 32]; prefill, x packed by pack_x_q8_vnni (xd unused)
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  // The block types' decode with int8 activations (kquant_int8_vnni): the sums of xq over each 16 and each 32
  // columns
  const float* xs16 = nullptr;
  const float* xs32 = nullptr;
};
using MatmulRangeFn = void (*)(const MatmulArgs& a, int64_t r0, int64_t r1);
// Packs token tiles [j0, j1) of x [n_tokens, cols] into xp (MatmulArgs::xp's layout).
using MatmulPackXFn = void (*)(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp);

// The block-quantized types of core/quants.h that matmul runs besides Q8_0, as indices of
// MatmulKernels::blocks; block_kind() maps a GgmlType to one (-1: not one of them).
enum BlockKind : int {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_NL,
  kIQ4_XS,
  kMXFP4,
  kBlockKinds
};
int block_kind(GgmlType t);
struct BlockKernelTable {
  MatmulRangeFn fn[kBlockKinds];
};

struct MatmulKernels {
  MatmulRangeFn f32, f16, bf16, q8_0;
  MatmulRangeFn fp8, ternary;  // F8_E4M3 (matmul_fp8*.cpp), TERNARY (matmul_ternary*.cpp)
  const char* name;
  // The packed-panel GEMM of f32/f16/bf16/q8_0 prefill steps of at least panel_min_tokens tokens (0: none),
  // in token tiles of panel_nr; pack_x packs its x for MatmulArgs::xp.
  MatmulPackXFn pack_x = nullptr;
  int panel_nr = 0;
  int panel_min_tokens = 0;
  // Block types (matmul_blocks.h: f32 activations, each block dequantised exactly), by BlockKind.
  BlockKernelTable blocks = {};
};

// The F8_E4M3 and TERNARY range kernels of each SIMD level (matmul_fp8_avx2.cpp, ...).
void matmul_fp8_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_fp8_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_ternary_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_ternary_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);

// Scalar (matmul_ref's arithmetic on a row range, matmul.cpp), AVX2+FMA+F16C (matmul_avx2.cpp) and AVX-512
// (matmul_avx512.cpp). Call the SIMD ones only when cpu_supports() their level.
const MatmulKernels& matmul_kernels_scalar();
const MatmulKernels& matmul_kernels_avx2();
const MatmulKernels& matmul_kernels_avx512();
// The kernels of active_isa().
const MatmulKernels& matmul_kernels();
// Whether this CPU can run matmul_kernels_avx2() / matmul_kernels_avx512().
bool cpu_has_avx2();
bool cpu_has_avx512();
// Whether this CPU has AVX512-VNNI besides cpu_has_avx512() (the *_vnni.cpp files).
bool cpu_has_avx512_vnni();
// Q8_0 with int8 activations (llama.cpp's numerics: x quantised per 32-block to int8 with an f32 scale,
// integer dot products per block), decode and prefill: the default on CPUs with AVX512-VNNI while the
// kernels run AVX-512; ULTRA_Q8_INT8=0 turns it off (cpu_tuning()). Off, or without VNNI, Q8_0 multiplies
// f32 activations exactly (what the tests pin: tests/pin_exact_numerics.cpp). q8_int8_wanted: tuning.h.
bool q8_int8_enabled();
// x [cols] (cols % 32 == 0) -> xq [cols] int8, xd [cols / 32]: per 32-block d = max |x| / 127, q = x / d
// rounded to nearest even (d = 0 and q = 0 for an all-zero block). quantize_x_q8_ref is the scalar
// reference, the other the AVX-512 one (cpu_has_avx512_vnni() must hold); the two give identical bytes.
void quantize_x_q8_ref(const float* x, int64_t cols, int8_t* xq, float* xd);
void quantize_x_q8_vnni(const float* x, int64_t cols, int8_t* xq, float* xd);
// Q8_0 rows [r0, r1) . the quantised x (a.xq, a.xd; n_tokens == 1): sum over blocks of d_w * d_x * (the
// exact integer dot product of the block). The reference does the same arithmetic in double.
void matmul_q8_int8_ref(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_q8_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
// Prefill (n_tokens > 1) with int8 activations: x packed once per matmul by pack_x_q8_vnni (token tiles
// [j0, j1) of kQ8NT tokens into xp; a tile's block is kQ8TileBlockBytes, the layout in
// matmul_q8_vnni.cpp), then matmul_q8_int8_gemm_vnni with a.xq = xp at the first tile of a.x's tokens.
// Each output is the reference's sum over blocks (matmul_q8_int8_ref of the token's quantize_x_q8_ref).
constexpr int kQ8NT = 6;
constexpr int64_t kQ8TileBlockBytes = 8 * kQ8NT * 4 + kQ8NT * 8;  // x quads, then d_x and corrections
void pack_x_q8_vnni(const float* x, int n_tokens, int64_t cols, int j0, int j1, uint8_t* xp);
// Decode (n_tokens == 1) of Q4_K, Q5_K, Q6_K, IQ4_XS and the 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL) with int8 activations (matmul_kquant_vnni.cpp), on while
// q8_int8_enabled(): x quantised as for Q8_0 (a.xq, a.xd) with the sums of xq per 16 and 32 columns
// (a.xs16, a.xs32: x_sums_q8). Each output is the f32-rounded value of matmul.cpp's reference, the exact
// weights times xq * xd summed in double.
void matmul_q4k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_q6k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_iq4xs_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
void matmul_q5k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
// The 32-element blocks T (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; B its block struct): x's sums per 32 (a.xs32).
template <GgmlType T, class B>
void matmul_b32_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
// The kernel of a block type above (nullptr for the others); its scalar reference.
MatmulRangeFn kquant_int8_vnni(GgmlType t);
void matmul_kquant_int8_ref(GgmlType t, const MatmulArgs& a, int64_t r0, int64_t r1);
// xs16[k] = sum of xq[16 k .. 16 k + 15], xs32[k] = sum of xq[32 k .. 32 k + 31] (cols % 32 == 0).
void x_sums_q8(const int8_t* xq, int64_t cols, float* xs16, float* xs32);
void matmul_q8_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1);
// Tests: force q8_int8_enabled() on (1, where the CPU has AVX512-VNNI) or off (0); -1: the environment;
// 2: on with the scalar reference kernels on any CPU (q8_int8_reference(): matmul() then quantises each
// token's x with quantize_x_q8_ref and runs matmul_q8_int8_ref on the calling thread; slow, for fixtures).
void set_q8_int8_override(int on);
bool q8_int8_reference();

// Whether prefill steps may take an ISA's packed-panel GEMM (matmul_driver.h): true unless the environment
// has ULTRA_CPU_PANEL=0 (A/B measurements; cpu_tuning()).
bool panel_gemm_enabled();
// Tests/benchmarks: make matmul() use k (nullptr: back to matmul_kernels()). Not thread-safe w.r.t. running
// matmuls; call between them.
void set_matmul_kernels_override(const MatmulKernels* k);

// ---- AVX2 bodies of the other ops (norm_avx2.cpp, attention_avx2.cpp), same contracts as in ops.h ----
void rmsnorm_avx2(const float* x, const float* weight, int n_rows, int n, float eps, float* out);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);
// gelu_tanh(g) * u as g * sigmoid(2 y) * u, y = sqrt(2/pi) (g + 0.044715 g^3) (0.5 (1 + tanh y) is
// sigmoid(2 y)): exp256 instead of a libm tanh per element.
void gelu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);
// n floats -> n halves (round to nearest even), and back.
void f32_to_f16_row_avx2(const float* x, uint16_t* out, int64_t n);
void f16_to_f32_row_avx2(const uint16_t* x, float* out, int64_t n);

// One thread's share of attention(): (token, head) pairs ith, ith + nth, ... (attention.cpp's scalar
// version, attention_kernel.h's SIMD one in attention_avx2.cpp and attention_avx512.cpp).
struct AttentionArgs {
  const KvLayerView* kv;
  const float* q;
  int n_tokens, n_heads;
  const int32_t* pos;
  const int32_t* slot;
  float scale;
  float* out;
  float* scratch;  // per thread: attention_scratch_stride(max_ctx) floats
  float softcap;   // > 0: scores tanh(s / softcap) * softcap
  int window;      // > 0: positions (pos - window, pos] only
  const float* sinks =
      nullptr;  // [n_heads] sink logits in each head's softmax denominator (gpt-oss), or null
};
// Head h's sink logit: a.sinks[h], or -infinity (nothing added to the softmax) without sinks.
static inline float attention_sink(const AttentionArgs& a, int h) {
  return a.sinks ? a.sinks[h] : -INFINITY;
}
void attention_thread_scalar(const AttentionArgs& a, int ith, int nth);
void attention_thread_avx2(const AttentionArgs& a, int ith, int nth);
void attention_thread_avx512(const AttentionArgs& a, int ith, int nth);
// Runs the per-thread attention loop of one level (cpu_supports(isa) must hold) on the pool: attention()
// passes active_isa(), the tests each level.
void attention_isa(Isa isa, ThreadPool& pool, const AttentionArgs& a);
// Element offset of (slot, kv head, position) in a KV cache layer ([slots, kv_heads, max_ctx, head_dim]).
static inline size_t cache_index(const KvLayerView& kv, int slot, int head, int pos) {
  return (((size_t)slot * kv.n_kv_heads + head) * kv.max_ctx + pos) * kv.head_dim;
}
// The first position a token at pos attends: pos - window + 1 with a window (HF: j > i - window), else 0.
static inline int attention_first(int pos, int window) {
  return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}
// Per thread: kAttentionTile score rows of attention_score_row(max_ctx) floats (the SIMD loop scores up to
// that many queries of one head at once; the scalar one uses the first row).
constexpr int kAttentionTile = 4;
static constexpr size_t attention_score_row(int max_ctx) {
  return ((size_t)max_ctx + 15) / 16 * 16;
}
static constexpr size_t attention_scratch_stride(int max_ctx) {
  return attention_score_row(max_ctx) * kAttentionTile;
}
// The loop of a thread's share: f(q, out, first, n_pos, slot, kv_head, scratch, sink) for pairs ith, ith +
// nth,
// ... (q and out the pair's head_dim rows, positions [first, first + n_pos) of the slot's kv_head, the head's
// sink logit).
template <class F>
static inline void for_each_attention_pair(const AttentionArgs& a, int ith, int nth, F&& f) {
  const int hd = a.kv->head_dim, group = a.n_heads / a.kv->n_kv_heads;
  float* sc = a.scratch + attention_scratch_stride(a.kv->max_ctx) * ith;
  for (int pr = ith; pr < a.n_tokens * a.n_heads; pr += nth) {
    const int t = pr / a.n_heads, h = pr % a.n_heads;
    const int first = attention_first(a.pos[t], a.window);
    f(a.q + (size_t)pr * hd, a.out + (size_t)pr * hd, first, a.pos[t] + 1 - first, a.slot[t], h / group, sc,
      attention_sink(a, h));
  }
}

}  // namespace ultra::cpu::detail
