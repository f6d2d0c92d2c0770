// Ternary (BitNet b1.58) weights: each weight is s * t with t in {-1, 0, +1} and s a scale per tensor, per
// output row, or per group of columns (llama.cpp's TQ1_0/TQ2_0, repacked at load, have one per 256).
// Packing: 16 trits per little-endian u32, element i of the word at bits 2i..2i+1: 00 -> 0, 01 -> +1,
// 10 -> -1; 11 is invalid (rejected at load). A row of cols weights (cols % 16 == 0) is cols / 16 words.
//
// Quantisation (BitNet b1.58): s = mean |W| (at least 1e-5), t = clamp(round(W / s), -1, 1), rounding half
// to even.
#pragma once

#include <cstdint>

namespace ultra {

constexpr int kTernaryPerWord = 16;

// Code of one trit (-1, 0, +1) and back. 11 decodes to 0 here; ternary_word_valid() finds it.
static inline uint32_t ternary_code(int t) {
  return t > 0 ? 1u : t < 0 ? 2u : 0u;
}
static inline int ternary_trit(uint32_t word, int i) {
  const uint32_t c = (word >> (2 * i)) & 3;
  return c == 1 ? 1 : c == 2 ? -1 : 0;
}
// False when some element of the word has the invalid code 11.
static inline bool ternary_word_valid(uint32_t word) {
  return (word & (word >> 1) & 0x55555555u) == 0;
}

// n trits (n % 16 == 0) -> n / 16 words, and back.
static inline void ternary_pack(const int8_t* t, int64_t n, uint32_t* out) {
  for (int64_t w = 0; w < n / kTernaryPerWord; ++w) {
    uint32_t v = 0;
    for (int i = 0; i < kTernaryPerWord; ++i) v |= ternary_code(t[w * kTernaryPerWord + i]) << (2 * i);
    out[w] = v;
  }
}
static inline void ternary_unpack(const uint32_t* words, int64_t n, int8_t* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = (int8_t)ternary_trit(words[i / kTernaryPerWord], (int)(i % kTernaryPerWord));
}

}  // namespace ultra
