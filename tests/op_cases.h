// The op table of the backend op harness: every case is one op on one shape and one type with its tolerance
// rule, run against the op's scalar reference (the *_ref functions of backend/cpu/ops.h and cpu_internal.h)
// on every CPU kernel set that has a kernel for it (test_backend_ops.cpp) and on the CUDA kernels
// (gpu/test_cuda_ops.cpp, with the CUDA rules of tol_cuda below). Adding a weight type or a shape is adding
// rows here. Only core/dtype.h is needed; op_inputs.h makes each case's inputs for both harnesses.
//
// Tolerance rule of a case: |y_i - ref_i| <= tol.rel * |ref_i| + tol.abs * mag_i, where mag_i is the op's
// magnitude of element i (see Mag). Exact cases compare bits (both NaN also matches).
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace ultra::test {

enum class Op {
  Matmul,      // y[t, r] = W[r, :] . x[t, :] (+ bias[r]); rows x cols weights, tokens
  RmsNorm,     // rows rows of cols elements
  Rope,        // rows heads of head_dim cols, tokens tokens
  SiluMul,     // cols elements
  GeluMul,     // cols elements
  Softcap,     // cols elements, cap = param
  Attention,   // rows query heads on kv_heads, head_dim cols, tokens after ctx positions of history
  QuantizeQ8,  // the int8 activation quantiser (Q8_0 x int8 matmul), cols elements
  F16Convert,  // f32 -> f16 -> f32 rows of cols elements
};

// What mag_i of the tolerance rule is for each op.
enum class Mag {
  One,     // 1 (absolute)
  DotF32,  // sqrt(cols) * (sum_c |w_rc x_tc| + |bias_r|): a dot product of cols f32 products
  Input,   // |u_i| (gelu_mul: where 1 + tanh cancels the relative error does not hold)
  Pair,    // |x0| + |x1| of the rotated input pair (rope)
  MaxV,    // max |v| over the cache (attention: out is a convex combination of v rows)
  Param,   // the case's param (softcap: the cap)
};

struct Tol {
  double rel = 0, abs = 0;  // both 0: exact
  Mag mag = Mag::One;
  bool exact() const { return rel == 0 && abs == 0; }
};

// Whether y is within the rule around ref (mag: element i's mag_i); *bound receives the bound (0 if exact).
inline bool within(const Tol& t, float y, float ref, double mag, double* bound = nullptr) {
  if (bound) *bound = 0;
  if (t.exact()) return std::memcmp(&y, &ref, 4) == 0 || (std::isnan(y) && std::isnan(ref));
  const double b = t.rel * std::fabs((double)ref) + t.abs * mag;
  if (bound) *bound = b;
  return std::fabs((double)y - ref) <= b;  // false for NaN
}

// Input data beyond i.i.d. normal values.
enum class Data {
  Normal,
  Q8WideScales,  // Q8_0 weights: block scales 2^-8 .. 2^8, every 7th block all zero
  XBlocks,       // activations: a zero 32-block, a block 1000x larger, a block with one non-zero value
};

struct OpCase {
  Op op;
  GgmlType type = GgmlType::F32;  // matmul weights, attention KV cache
  int64_t rows = 1, cols = 1;
  int tokens = 1;
  std::vector<int> threads = {1};  // thread counts of the threaded ops (matmul, attention)
  Tol tol;
  Data data = Data::Normal;
  bool bias = false;         // matmul
  int64_t group = 0;         // F8_E4M3 / TERNARY scale group: 0 one per row, -1 one per tensor, else columns
  float param = 0;           // softcap cap; rope mscale
  bool interleaved = false;  // rope pairing
  int kv_heads = 1, ctx = 0, window = 0;  // attention: history positions before this step's tokens
  float softcap = 0;                      // attention score cap
  bool sinks = false;                     // attention: a sink logit per head (gpt-oss), op_inputs.h's
  uint32_t seed = 1;
};

// ---- tolerance rules, with their derivations ----

// Every weight type is converted exactly to f32 in registers (F16/BF16 widen; Q8_0's q * d has 7 + 11
// significant bits; F8_E4M3 and TERNARY codes times their scale round once, u relative, far below the bound),
// so the kernels differ from the float64 reference only by f32 rounding in the FMA chains: with L lanes each
// lane sums cols/L products, the errors are independent, ~u*sqrt(cols)*sum|w x| (u = 6e-8); a generous
// factor gives 1e-6. Dropping one column changes y by ~sum|w x|/cols (2.4e-4 * sum at 4128 columns, against
// 6.4e-5), a Q8_0 block ~32 times that. The int8-activation kernel (VNNI) is held to the same rule against
// its own reference (x replaced by its int8 values times the block scale).
inline Tol tol_matmul() {
  return {0, 1e-6, Mag::DotF32};
}
// rmsnorm: the f32 sum of squares over 16 lanes is off by ~u*sqrt(n/16) relative (<= u*(n/16+4), 1.6e-5 at
// n = 4128), the scale inherits half, ~3 ulp for sqrt/div/two products: 4e-6 of the float64 value; the
// reference is within 1 ulp of it: 4.1e-6 relative.
inline Tol tol_rmsnorm() {
  return {4.1e-6, 1e-30, Mag::One};
}
// silu_mul: the vector exp is within 2.5e-7 relative, entering the sigmoid scaled by <= 1; the division and
// two products 1 ulp each: 1e-6 of float64, plus the reference's ulp. Below g = -87.3 the kernel flushes to
// 0 (true |value| < 1e-36).
inline Tol tol_silu() {
  return {1.1e-6, 1e-36, Mag::One};
}
// gelu_mul: tanh (libm ~1 ulp, or sigmoid(2y) through a ~2 ulp vector exp) and ~6 f32 roundings: 2e-6
// relative, plus 1e-6 |u| where 1 + tanh(.) cancels (g << 0, the value is tiny).
inline Tol tol_gelu() {
  return {2.1e-6, 1e-6, Mag::Input};
}
// softcap: f32 tanh (~1 ulp) of an f32 quotient, times cap: 1e-6 * cap absolute.
inline Tol tol_softcap() {
  return {1e-7, 1e-6, Mag::Param};
}
// rope: f32 cosf/sinf of the f32 angle (<= 1 ulp, the angle itself is the reference's), two products and a
// sum: 3e-7 (|x0| + |x1|) plus the result's rounding; 1e-6 (|x0| + |x1|).
inline Tol tol_rope() {
  return {0, 1.1e-6, Mag::Pair};
}
// attention: out = sum_p a_p v_p with sum a_p = 1; the f32 scores are off by ~u*hd*|q||k|*scale plus the
// exp's 2.5e-7 relative, each moving a_p relatively: |out - ref| <= max|v| * few 1e-6; 2e-5 max|v|. One
// position too many or too few moves out by ~|v| / n_pos (1e-3 at 1000 positions).
inline Tol tol_attention() {
  return {0, 2e-5, Mag::MaxV};
}
inline Tol tol_exact() {
  return {};
}

// ---- the CUDA kernels' rules (gpu/test_cuda_ops.cpp), and why they differ from the CPU's ----
//
// matmul: the paths of CudaMatmul::matmul that round an input (the BF16 copy of Q8_0 / F8_E4M3 / TERNARY
// weights above kLowbitGemvMaxRows rows where the tensor-core low-bit gemv does not apply; x converted to
// BF16 / F16 for cuBLASLt above kGemvMaxRows rows) are compared with matmul_ref on inputs rounded the same
// way (the CPU's int8-activation path is checked the same way), so that the rule bounds only the summation.
// That runs on tensor cores: x split into TF32 hi + lo parts (F32 weights too: three products, each
// dropping <= 3 * 2^-22 |w x|), or f16 parts (the low-bit tensor-core gemv), with MMA accumulators whose
// adds are not round-to-nearest, so their error can grow with the number of MMAs in a chain rather than
// with its square root: twice the CPU's bound, which still fails a dropped column at 4128 columns (2.4e-4
// sum |w x| against 1.3e-4).
// rmsnorm, silu_mul, gelu_mul, softcap, rope: the CPU's rules hold as derived above: nvcc builds without
// fast math (IEEE division and sqrt; expf and tanhf within 2 ulp), rope's cos / sin and rotation in double
// as rope_ref's; softcap multiplies by 1 / cap (one more rounding of the argument, <= 3e-8 cap after tanh).
// attention (the per-row kernel: the table's steps are below kAttentionTiledMinRows rows): q . k on tensor
// cores with q in TF32 hi + lo parts (f32 accurate), softmax through exp2f of scores pre-scaled by log2 e
// (one more rounding, ~|s| u relative per probability, |s| <= 30 here: 2e-6), P.V in f32: the CPU's rule.
// f16_convert: __float2half_rn, bit for bit (f32 -> f16 only: the device has no f16 -> f32 row kernel).
inline Tol tol_cuda(const OpCase& c) {
  if (c.op == Op::Matmul) return {0, 2e-6, Mag::DotF32};
  return c.tol;
}

// ---- the table ----

inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> v;
  uint32_t seed = 100;
  auto add = [&](OpCase c) {
    c.seed = ++seed;
    v.push_back(c);
  };
  const GgmlType kBlockFree[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
  const GgmlType kDense[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0};

  // matmul, dense types: columns of whole Q8_0 blocks (1, 3, 24 and 129 blocks), rows that are tails of the
  // 16/32-row panels and of the 4-row tiles, decode (1 token), the tiles' token counts and tails, and the
  // packed-panel GEMM (>= 16 tokens); 1, 2 and 3 threads; a bias on odd token counts.
  for (GgmlType t : kDense)
    for (int64_t cols : {32, 96, 768, 4128})
      for (int64_t rows : {1, 7, 33, 513})
        for (int nt : {1, 2, 3, 5, 8, 13, 17, 24}) {
          OpCase c{Op::Matmul, t, rows, cols, nt, {1, 2, 3}, tol_matmul()};
          c.bias = nt % 2;
          add(c);
        }
  // Float types take any column count: the scalar (AVX2) and masked (AVX-512) column tails.
  for (GgmlType t : kBlockFree)
    for (int64_t cols : {1, 3, 20, 50, 127})
      for (int nt : {1, 3, 6, 18}) add({Op::Matmul, t, 13, cols, nt, {1, 2, 3}, tol_matmul()});
  // Q8_0 block scales 2^-8 .. 2^8 and zero blocks: a neighbouring block's scale, one scale per row or tile,
  // a dropped or doubled block all fail; odd block counts (the 2-block step's tail of the AVX-512 decode).
  for (int64_t cols : {32, 64, 96, 160, 4128})
    for (int64_t rows : {1, 7, 33, 130})
      for (int nt : {1, 2, 4, 7, 9, 19}) {
        OpCase c{Op::Matmul, GgmlType::Q8_0, rows, cols, nt, {1, 2, 3}, tol_matmul()};
        c.data = Data::Q8WideScales;
        add(c);
      }
  // Activations with a zero block, a 1000x block and a one-element block; and a 100-token prefill that
  // several threads split by tokens too.
  for (GgmlType t : kDense) {
    for (int nt : {1, 7}) {
      OpCase c{Op::Matmul, t, 33, 768, nt, {1, 3}, tol_matmul()};
      c.data = Data::XBlocks;
      add(c);
    }
    OpCase c{Op::Matmul, t, 130, 96, 100, {1, 3}, tol_matmul()};
    c.bias = true;
    add(c);
  }
  // F8_E4M3: a scale per row (any column count), per tensor, and HF's 128-column blocks (the last partial).
  for (int64_t rows : {1, 5, 37})
    for (int64_t cols : {1, 7, 16, 33, 100, 259})
      for (int nt : {1, 3, 9}) add({Op::Matmul, GgmlType::F8_E4M3, rows, cols, nt, {1, 3}, tol_matmul()});
  for (int64_t group : {-1, 128, 32})
    for (int nt : {1, 4, 17}) {
      OpCase c{Op::Matmul, GgmlType::F8_E4M3, 7, 300, nt, {1, 3}, tol_matmul()};
      c.group = group;
      c.bias = true;
      add(c);
    }
  // TERNARY: 16-column words (columns not a multiple of 64), a scale per row, per tensor, per 256 (TQ1_0 and
  // TQ2_0 repacked) and per 16 columns.
  for (int64_t rows : {1, 9, 37})
    for (int64_t cols : {16, 48, 80, 272, 768})
      for (int nt : {1, 3, 9}) add({Op::Matmul, GgmlType::TERNARY, rows, cols, nt, {1, 3}, tol_matmul()});
  for (int64_t group : {-1, 256, 16})
    for (int nt : {1, 4, 17}) {
      OpCase c{Op::Matmul, GgmlType::TERNARY, 9, 768, nt, {1, 3}, tol_matmul()};
      c.group = group;
      c.bias = true;
      add(c);
    }

  // Block types (core/quants.h; random code bytes and scales): decode, the 4-token tiles and their tails,
  // and the packed-panel GEMM (>= 16 tokens, its panels dequantised 256 columns at a time); 32-element blocks
  // at 1, 3 and 24 blocks, super-blocks at 1, 3 and 9; row counts that are panel and chunk tails.
  const GgmlType kBlocks32[] = {GgmlType::Q4_0, GgmlType::Q4_1,   GgmlType::Q5_0,
                                GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::MXFP4};
  const GgmlType kBlocks256[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                 GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};
  for (GgmlType t : kBlocks32)
    for (int64_t cols : {32, 96, 768})
      for (int nt : {1, 3, 6, 17}) {
        OpCase c{Op::Matmul, t, 37, cols, nt, {1, 3}, tol_matmul()};
        c.bias = nt % 2;
        add(c);
      }
  for (GgmlType t : kBlocks256)
    for (int64_t cols : {256, 768, 2304})
      for (int nt : {1, 3, 6, 17}) {
        OpCase c{Op::Matmul, t, 37, cols, nt, {1, 3}, tol_matmul()};
        c.bias = nt % 2;
        add(c);
      }

  // element-wise ops: lengths below, at and past the 8/16-lane vectors
  for (int64_t n : {1, 7, 32, 96, 768, 4128}) add({Op::RmsNorm, GgmlType::F32, 3, n, 1, {1}, tol_rmsnorm()});
  for (int64_t n : {1, 7, 8, 33, 2048}) add({Op::SiluMul, GgmlType::F32, 1, n, 1, {1}, tol_silu()});
  for (int64_t n : {1, 7, 33, 1001}) add({Op::GeluMul, GgmlType::F32, 1, n, 1, {1}, tol_gelu()});
  for (int64_t n : {1, 9, 320})
    for (float cap : {30.0f, 50.0f, 0.5f}) {
      OpCase c{Op::Softcap, GgmlType::F32, 1, n, 1, {1}, tol_softcap()};
      c.param = cap;
      add(c);
    }
  for (int64_t n : {1, 7, 8, 9, 33, 1001, 65536})
    add({Op::F16Convert, GgmlType::F16, 1, n, 1, {1}, tol_exact()});
  for (int64_t n : {32, 96, 160, 4128}) {
    OpCase c{Op::QuantizeQ8, GgmlType::F32, 1, n, 1, {1}, tol_exact()};
    c.data = Data::XBlocks;
    add(c);
  }

  // RoPE: both pairings, head_dim 64 / 128 / 10 (odd pair counts), decode and prefill, positions to 40000,
  // and LongRoPE's mscale.
  for (bool inter : {false, true})
    for (int64_t hd : {10, 64, 128})
      for (int nt : {1, 5})
        for (float mscale : {1.0f, 1.25f}) {
          OpCase c{Op::Rope, GgmlType::F32, 4, hd, nt, {1}, tol_rope()};
          c.interleaved = inter;
          c.param = mscale;
          add(c);
        }

  // attention: GQA (8 query heads on 2 kv heads, 6 on 2), F32 and F16 caches, head_dim 64 / 128 and the
  // tails 18 / 20 / 96; a decode step far into the cache and prefill query tiles (4 + 3); sliding windows
  // (1, shorter and longer than the history) and soft-capped scores.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16})
    for (int64_t hd : {20, 64, 96, 128})
      for (int nt : {1, 7}) {
        OpCase c{Op::Attention, t, 8, hd, nt, {1, 3}, tol_attention()};
        c.kv_heads = 2;
        c.ctx = 1000;
        add(c);
      }
  for (GgmlType t : {GgmlType::F32, GgmlType::F16})
    for (int window : {0, 1, 6, 41, 100})
      for (float cap : {0.0f, 5.0f}) {
        OpCase c{Op::Attention, t, 6, 18, 11, {3}, tol_attention()};
        c.kv_heads = 2;
        c.ctx = 50;
        c.window = window;
        c.softcap = cap;
        add(c);
      }
  // The same at head_dim 64 (the CUDA kernels take head_dim % 8 == 0 only) over 300 positions: windows
  // inside one 64-position tile, across tiles and longer than the row.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16})
    for (int window : {0, 1, 6, 100, 1000})
      for (float cap : {0.0f, 5.0f}) {
        if (window == 0 && cap == 0) continue;
        OpCase c{Op::Attention, t, 8, 64, 11, {3}, tol_attention()};
        c.kv_heads = 2;
        c.ctx = 300;
        c.window = window;
        c.softcap = cap;
        add(c);
      }
  // gpt-oss's attention sinks (a logit per head in the softmax's denominator, some above every score): a
  // decode step and prefill tiles, full and sliding (window 6), GQA 8 on 2, head_dim 64 and the tail 20.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16})
    for (int64_t hd : {20, 64})
      for (int window : {0, 6})
        for (int nt : {1, 7}) {
          OpCase c{Op::Attention, t, 8, hd, nt, {1, 3}, tol_attention()};
          c.kv_heads = 2;
          c.ctx = 50;
          c.window = window;
          c.sinks = true;
          add(c);
        }
  // Mistral's whole-model window (12) far shorter than the history: a decode step and a prefill tile 1000
  // positions in, GQA 8 on 2, head_dim 64 / 128.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16})
    for (int64_t hd : {64, 128})
      for (int nt : {1, 7}) {
        OpCase c{Op::Attention, t, 8, hd, nt, {1, 3}, tol_attention()};
        c.kv_heads = 2;
        c.ctx = 1000;
        c.window = 12;
        add(c);
      }
  return v;
}

// ---- names ----

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Matmul:
      return "matmul";
    case Op::RmsNorm:
      return "rmsnorm";
    case Op::Rope:
      return "rope";
    case Op::SiluMul:
      return "silu_mul";
    case Op::GeluMul:
      return "gelu_mul";
    case Op::Softcap:
      return "softcap";
    case Op::Attention:
      return "attention";
    case Op::QuantizeQ8:
      return "quantize_q8";
    case Op::F16Convert:
      return "f16_convert";
  }
  return "?";
}

inline std::string lower_name(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = (char)std::tolower((unsigned char)ch);
  return r;
}

// A number in a name: trailing zeros dropped, '.' as 'p'.
inline std::string name_num(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (char& ch : s)
    if (ch == '.') ch = 'p';
  return s;
}

// The case's name (letters, digits, underscores; gtest's test names), e.g. matmul_q8_0_r33_c4128_t17.
inline std::string case_name(const OpCase& c) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  std::string s;
  switch (c.op) {
    case Op::Matmul:
      s = "matmul_" + lower_name(type_name(c.type)) + "_r" + n(c.rows) + "_c" + n(c.cols) + "_t" +
          n(c.tokens);
      if (c.group) s += c.group < 0 ? "_gtensor" : "_g" + n(c.group);
      if (c.data == Data::Q8WideScales) s += "_widescales";
      if (c.data == Data::XBlocks) s += "_xblocks";
      if (c.bias) s += "_bias";
      return s;
    case Op::RmsNorm:
      return "rmsnorm_r" + n(c.rows) + "_n" + n(c.cols);
    case Op::SiluMul:
      return "silu_mul_n" + n(c.cols);
    case Op::GeluMul:
      return "gelu_mul_n" + n(c.cols);
    case Op::Softcap:
      return "softcap_n" + n(c.cols) + "_cap" + name_num(c.param);
    case Op::F16Convert:
      return "f16_convert_n" + n(c.cols);
    case Op::QuantizeQ8:
      return "quantize_q8_n" + n(c.cols);
    case Op::Rope:
      return std::string("rope_") + (c.interleaved ? "interleaved" : "neox") + "_hd" + n(c.cols) + "_t" +
             n(c.tokens) + "_m" + name_num(c.param);
    case Op::Attention:
      return "attention_" + lower_name(type_name(c.type)) + "_h" + n(c.rows) + "_kv" + n(c.kv_heads) + "_hd" +
             n(c.cols) + "_t" + n(c.tokens) + "_ctx" + n(c.ctx) + "_w" + n(c.window) + "_cap" +
             name_num(c.softcap) + (c.sinks ? "_sinks" : "");
  }
  return "?";
}

}  // namespace ultra::test
