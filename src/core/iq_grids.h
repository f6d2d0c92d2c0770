// The lattice grids of the i-quant formats (core/quants_iq.h), expanded at compile time from the packed
// tables of iq_grids_packed.h (tools/gen_iq_grids.py writes those from ggml's ggml-common.h): entry i of a
// grid is the 8 (IQ2_*, IQ1_*) or 4 (IQ3_*) signed bytes ggml reads as (const uint8_t *)(grid + i) (IQ1's
// bytes as int8_t: -1, 0, 1). And the sign tables the IQ2 / IQ3 formats index with 7 bits: the 8th sign is
// the parity of the 7 (ggml's ksigns_iq2xs).
#pragma once

#include <array>
#include <cstdint>

#include "core/iq_grids_packed.h"

namespace ultra {

namespace iq_detail {

template <int B, int N, int L>
constexpr std::array<std::array<int8_t, B>, N> expand(const uint16_t (&packed)[N],
                                                      const int8_t (&levels)[L]) {
  constexpr int bits = B == 8 ? 2 : 3;
  std::array<std::array<int8_t, B>, N> g{};
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < B; ++j) g[i][j] = levels[(packed[i] >> (bits * j)) & ((1 << bits) - 1)];
  return g;
}

}  // namespace iq_detail

inline constexpr auto kIq2xxsGrid = iq_detail::expand<8>(iq_packed::kIq2xxs, iq_packed::kIq2xxsLevels);
inline constexpr auto kIq2xsGrid = iq_detail::expand<8>(iq_packed::kIq2xs, iq_packed::kIq2xsLevels);
inline constexpr auto kIq2sGrid = iq_detail::expand<8>(iq_packed::kIq2s, iq_packed::kIq2sLevels);
inline constexpr auto kIq3xxsGrid = iq_detail::expand<4>(iq_packed::kIq3xxs, iq_packed::kIq3xxsLevels);
inline constexpr auto kIq3sGrid = iq_detail::expand<4>(iq_packed::kIq3s, iq_packed::kIq3sLevels);
inline constexpr auto kIq1sGrid = iq_detail::expand<8>(iq_packed::kIq1s, iq_packed::kIq1sLevels);

// ksigns_iq2xs: 7 sign bits and their parity as the 8th (an even number of minus signs in every 8).
inline constexpr std::array<uint8_t, 128> kIqSigns = [] {
  std::array<uint8_t, 128> s{};
  for (int i = 0; i < 128; ++i) s[i] = (uint8_t)(i | ((__builtin_popcount(i) & 1) << 7));
  return s;
}();

// kIqSigns[i] as 8 bytes, -1 where the bit is set and +1 where it is not (for _mm_sign_epi8).
inline constexpr std::array<uint64_t, 128> kIqSignBytes = [] {
  std::array<uint64_t, 128> s{};
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 8; ++j) s[i] |= (uint64_t)((kIqSigns[i] >> j) & 1 ? 0xff : 0x01) << (8 * j);
  return s;
}();

inline constexpr float kIq1Delta = 0.125f;  // IQ1_S / IQ1_M: the grid's shift (IQ1S_DELTA)

}  // namespace ultra
