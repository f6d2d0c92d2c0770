// The block types of core/quants.h decoded with SSE/AVX2 integer instructions for the SIMD matmul
// (matmul_blocks.h): a block becomes one int8 code per element and, per 16 elements, a scale s and an offset
// o such that fma(s, code, o) is bit for bit dequant_block's value (up to the sign of a zero): each product
// s * code is exact in f32 (at most 22 significant bits) where dequant_block adds an offset, and is the
// same single rounding where it does not. Included only by files compiled with AVX2 or more (internal
// linkage: each keeps its own copy).
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "core/quants.h"
#include "core/quants_iq.h"

namespace ultra::cpu::detail {
namespace {

// f16 -> f32 with F16C (exact, as core/dtype.h's fp16_to_fp32).
inline float h2f(uint16_t h) {
  return _cvtsh_ss(h);
}

template <int QK>
struct Decoded {
  alignas(64) int8_t q[QK];
  float s[QK / 16], o[QK / 16];
};

inline __m256i nibbles_lo(__m256i v) {
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}
inline __m256i nibbles_hi(__m256i v) {
  return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
}
// Bits k (0..7) of each byte as 0 / 1 bytes.
inline __m256i bit_of(__m256i v, int k) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1));
}
// 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones (16..31).
inline __m256i split16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128((const __m128i*)p);
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// The 32 bits of a Q5 block's qh as bytes 0x10 (bit set) or 0.
inline __m256i q5_high(const uint8_t qh[4]) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const __m256i idx = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), idx);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}
inline __m256i lookup16(__m256i idx, const int8_t table[16]) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)table));
  return _mm256_shuffle_epi8(t, idx);
}
inline void store32(int8_t* q, __m256i v) {
  _mm256_store_si256((__m256i*)q, v);
}
inline void set_pair(float* s, float* o, int c, float sv, float ov) {  // a 32-element sub-block
  s[c] = s[c + 1] = sv;
  o[c] = o[c + 1] = ov;
}

inline void decode(const BlockQ4_0& b, Decoded<32>& d) {
  store32(d.q, _mm256_sub_epi8(split16(b.qs), _mm256_set1_epi8(8)));
  set_pair(d.s, d.o, 0, h2f(b.d), 0.0f);
}
inline void decode(const BlockQ4_1& b, Decoded<32>& d) {
  store32(d.q, split16(b.qs));
  set_pair(d.s, d.o, 0, h2f(b.d), h2f(b.m));
}
inline void decode(const BlockQ5_0& b, Decoded<32>& d) {
  store32(d.q, _mm256_sub_epi8(_mm256_or_si256(split16(b.qs), q5_high(b.qh)), _mm256_set1_epi8(16)));
  set_pair(d.s, d.o, 0, h2f(b.d), 0.0f);
}
inline void decode(const BlockQ5_1& b, Decoded<32>& d) {
  store32(d.q, _mm256_or_si256(split16(b.qs), q5_high(b.qh)));
  set_pair(d.s, d.o, 0, h2f(b.d), h2f(b.m));
}
inline void decode(const BlockIQ4_NL& b, Decoded<32>& d) {
  store32(d.q, lookup16(split16(b.qs), kIq4nlValues));
  set_pair(d.s, d.o, 0, h2f(b.d), 0.0f);
}
inline void decode(const BlockMXFP4& b, Decoded<32>& d) {
  store32(d.q, lookup16(split16(b.qs), kFp4Values));
  set_pair(d.s, d.o, 0, e8m0_to_fp32_half(b.e), 0.0f);
}
inline void decode(const BlockQ2_K& b, Decoded<256>& d) {
  const float dd = h2f(b.d), dmin = h2f(b.dmin);
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)(b.qs + 32 * h));
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
      store32(d.q + 128 * h + 32 * j, v);
    }
  }
  for (int c = 0; c < 16; ++c) {
    d.s[c] = dd * (b.scales[c] & 0xF);
    d.o[c] = -(dmin * (b.scales[c] >> 4));
  }
}
inline void decode(const BlockQ3_K& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  int8_t sc[16];
  q3k_scales(b.scales, sc);
  const __m256i hm = _mm256_loadu_si256((const __m256i*)b.hmask);
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)(b.qs + 32 * h));
    for (int j = 0; j < 4; ++j) {
      const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
      const __m256i hi = _mm256_slli_epi16(bit_of(hm, 4 * h + j), 2);  // 4 where the high bit is set
      store32(d.q + 128 * h + 32 * j, _mm256_sub_epi8(_mm256_add_epi8(lo, hi), _mm256_set1_epi8(4)));
    }
  }
  for (int c = 0; c < 16; ++c) {
    d.s[c] = dd * sc[c];
    d.o[c] = 0.0f;
  }
}
template <class B>
inline void decode_k45(const B& b, Decoded<256>& d, const uint8_t* qh) {
  const float dd = h2f(b.d), dmin = h2f(b.dmin);
  const __m256i h = qh ? _mm256_loadu_si256((const __m256i*)qh) : _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)(b.qs + 32 * g));
    __m256i lo = nibbles_lo(q), hi = nibbles_hi(q);
    if (qh) {
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(bit_of(h, 2 * g), 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(bit_of(h, 2 * g + 1), 4));
    }
    store32(d.q + 64 * g, lo);
    store32(d.q + 64 * g + 32, hi);
    for (int k = 0; k < 2; ++k) {
      uint8_t sc, m;
      q4k_scale_min(2 * g + k, b.scales, &sc, &m);
      set_pair(d.s, d.o, 4 * g + 2 * k, dd * sc, -(dmin * m));
    }
  }
}
inline void decode(const BlockQ4_K& b, Decoded<256>& d) {
  decode_k45(b, d, nullptr);
}
inline void decode(const BlockQ5_K& b, Decoded<256>& d) {
  decode_k45(b, d, b.qh);
}
inline void decode(const BlockQ6_K& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(b.ql + 64 * h));
    const __m256i c = _mm256_loadu_si256((const __m256i*)(b.ql + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i*)(b.qh + 32 * h));
    auto high = [&](int shift) {
      return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(shift)), m2), 4);
    };
    int8_t* q = d.q + 128 * h;
    store32(q, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(a, m4), high(0)), k32));
    store32(q + 32, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(c, m4), high(2)), k32));
    store32(q + 64, _mm256_sub_epi8(_mm256_or_si256(nibbles_hi(a), high(4)), k32));
    store32(q + 96, _mm256_sub_epi8(_mm256_or_si256(nibbles_hi(c), high(6)), k32));
  }
  for (int c = 0; c < 16; ++c) {
    d.s[c] = dd * b.scales[c];
    d.o[c] = 0.0f;
  }
}
inline void decode(const BlockIQ4_XS& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int s = 0; s < 8; ++s) {
    store32(d.q + 32 * s, lookup16(split16(b.qs + 16 * s), kIq4nlValues));
    set_pair(d.s, d.o, 2 * s, dd * (iq4xs_scale(b, s) - 32), 0.0f);
  }
}

// The grid i-quants: per 8 elements 8 grid bytes with their signs applied (codes up to +-62 for IQ2 / IQ3),
// or 8 * grid +- 1 for IQ1 (its +-delta of 1/8 folded into the code, the scale divided by 8: exact, a power
// of two); per 16 elements the scale, no offset. ggml's values are scale * grid * (+-1) and dl * (grid +-
// delta): the same single rounding of the same product.
inline constexpr auto kSignBytes = [] {  // bits of a sign byte -> 8 bytes of -1 (set) or +1
  std::array<uint64_t, 256> t{};
  for (int i = 0; i < 256; ++i)
    for (int j = 0; j < 8; ++j) t[i] |= (uint64_t)((i >> j) & 1 ? 0xff : 0x01) << (8 * j);
  return t;
}();
inline void put8(int8_t* q, uint64_t grid_bytes, uint8_t signs) {
  const __m128i v = _mm_cvtsi64_si128((long long)grid_bytes);
  _mm_storel_epi64((__m128i*)q, _mm_sign_epi8(v, _mm_cvtsi64_si128((long long)kSignBytes[signs])));
}
inline uint64_t bytes8(const std::array<int8_t, 8>& g) {
  uint64_t v;
  std::memcpy(&v, g.data(), 8);
  return v;
}
inline uint64_t bytes4x2(const std::array<int8_t, 4>& a, const std::array<int8_t, 4>& b) {
  uint32_t x, y;
  std::memcpy(&x, a.data(), 4);
  std::memcpy(&y, b.data(), 4);
  return x | (uint64_t)y << 32;
}
inline void put8_iq1(int8_t* q, const std::array<int8_t, 8>& g, bool minus) {
  for (int j = 0; j < 8; ++j) q[j] = (int8_t)(8 * g[j] + (minus ? -1 : 1));
}
// IQ2_XS / IQ2_S: the two per-16 scales of 32-element group ib from its scale byte.
inline void iq2_scales(Decoded<256>& d, int ib, float dd, uint8_t sc) {
  d.s[2 * ib] = iq2_scale(dd, sc & 0xf);
  d.s[2 * ib + 1] = iq2_scale(dd, sc >> 4);
  d.o[2 * ib] = d.o[2 * ib + 1] = 0.0f;
}
inline void decode(const BlockIQ2_XXS& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux[2];
    std::memcpy(aux, b.qs + 4 * ib, 8);
    for (int l = 0; l < 4; ++l)
      put8(d.q + 32 * ib + 8 * l, bytes8(kIq2xxsGrid[(aux[0] >> (8 * l)) & 0xff]),
           kIqSigns[(aux[1] >> (7 * l)) & 127]);
    set_pair(d.s, d.o, 2 * ib, iq2_scale(dd, aux[1] >> 28), 0.0f);
  }
}
inline void decode(const BlockIQ2_XS& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = b.qs[4 * ib + l];
      put8(d.q + 32 * ib + 8 * l, bytes8(kIq2xsGrid[q & 511]), kIqSigns[q >> 9]);
    }
    iq2_scales(d, ib, dd, b.scales[ib]);
  }
}
inline void decode(const BlockIQ2_S& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    for (int l = 0; l < 4; ++l)
      put8(d.q + 32 * ib + 8 * l, bytes8(kIq2sGrid[b.qs[4 * ib + l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)]),
           b.qs[32 + 4 * ib + l]);
    iq2_scales(d, ib, dd, b.scales[ib]);
  }
}
inline void decode(const BlockIQ3_XXS& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux;
    std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
    const uint8_t* qs = b.qs + 8 * ib;
    for (int l = 0; l < 4; ++l)
      put8(d.q + 32 * ib + 8 * l, bytes4x2(kIq3xxsGrid[qs[2 * l]], kIq3xxsGrid[qs[2 * l + 1]]),
           kIqSigns[(aux >> (7 * l)) & 127]);
    set_pair(d.s, d.o, 2 * ib, dd * (0.5f + (aux >> 28)) * 0.5f, 0.0f);
  }
}
inline void decode(const BlockIQ3_S& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {  // 32 elements: qs[8 ib ..], signs[4 ib ..], qh[ib]
    const uint8_t* qs = b.qs + 8 * ib;
    for (int l = 0; l < 4; ++l)
      put8(d.q + 32 * ib + 8 * l,
           bytes4x2(kIq3sGrid[qs[2 * l] | ((b.qh[ib] << (8 - 2 * l)) & 256)],
                    kIq3sGrid[qs[2 * l + 1] | ((b.qh[ib] << (7 - 2 * l)) & 256)]),
           b.signs[4 * ib + l]);
    const int sc = ib % 2 ? b.scales[ib / 2] >> 4 : b.scales[ib / 2] & 0xf;
    set_pair(d.s, d.o, 2 * ib, dd * (1 + 2 * sc), 0.0f);
  }
}
inline void decode(const BlockIQ1_S& b, Decoded<256>& d) {
  const float dd = h2f(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t h = b.qh[ib];
    for (int l = 0; l < 4; ++l)
      put8_iq1(d.q + 32 * ib + 8 * l, kIq1sGrid[b.qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)], h & 0x8000);
    set_pair(d.s, d.o, 2 * ib, dd * (2 * ((h >> 12) & 7) + 1) * 0.125f, 0.0f);
  }
}
inline void decode(const BlockIQ1_M& b, Decoded<256>& d) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  const float dd = h2f(iq1m_d(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t *qs = b.qs + 4 * ib, *qh = b.qh + 2 * ib;
    put8_iq1(d.q + 32 * ib, kIq1sGrid[qs[0] | ((qh[0] << 8) & 0x700)], qh[0] & 0x08);
    put8_iq1(d.q + 32 * ib + 8, kIq1sGrid[qs[1] | ((qh[0] << 4) & 0x700)], qh[0] & 0x80);
    put8_iq1(d.q + 32 * ib + 16, kIq1sGrid[qs[2] | ((qh[1] << 8) & 0x700)], qh[1] & 0x08);
    put8_iq1(d.q + 32 * ib + 24, kIq1sGrid[qs[3] | ((qh[1] << 4) & 0x700)], qh[1] & 0x80);
    for (int k = 0; k < 2; ++k) {
      d.s[2 * ib + k] = dd * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * k)) & 0x7) + 1) * 0.125f;
      d.o[2 * ib + k] = 0.0f;
    }
  }
}

}  // namespace
}  // namespace ultra::cpu::detail
