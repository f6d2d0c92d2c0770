// The i-quant formats built on lattice grids (core/iq_grids.h): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M, 256 elements per block, laid out byte for byte as ggml's block_iq* (ggml-common.h), and their
// exact scalar dequantisation: each value with the f32 operations of ggml's dequantize_row_iq* in the same
// order (tests/test_quants.cpp holds them bit for bit against llama.cpp's own dequantisation,
// tests/fixtures/quants/ggml_iq_ref.bin).
//
// Per group of 8 (IQ3: 4) elements a grid index; the sign of each element from 7 bits + parity (IQ2 / IQ3)
// or none (IQ1, whose grid is -1 / 0 / 1 shifted by +-delta per 32 or 8):
//   IQ2_XXS  d * (0.5 + s4) * 0.25 * grid[8-bit index] * sign     (s4 per 32, in the 4th index word)
//   IQ2_XS   d * (0.5 + s4) * 0.25 * grid[9-bit index] * sign     (s4 per 16)
//   IQ2_S    as IQ2_XS with 10-bit indices and 8 explicit sign bits per 8
//   IQ3_XXS  d * (0.5 + s4) * 0.5 * grid[8-bit index] * sign      (4 per index)
//   IQ3_S    d * (1 + 2 * s4) * grid[9-bit index] * sign          (4 per index, 8 explicit sign bits per 8)
//   IQ1_S    d * (2 * s3 + 1) * (grid[11-bit index] +- delta)     (s3 and delta's sign per 32)
//   IQ1_M    as IQ1_S with s3 per 16, delta's sign per 8, and d an f16 spread over the scale words
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/iq_grids.h"

namespace ultra {

struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t
      qs[32];  // per 32: two u32 words: 4 grid indices (bytes), then 4 x 7 sign bits and the scale (top 4)
};
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[32];    // per 8: 9-bit grid index, 7 sign bits
  uint8_t scales[8];  // per 32: two 4-bit scales (elements 0-15, 16-31)
};
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[64];     // 32 low 8 bits of the grid indices, then 32 bytes of signs (one per 8)
  uint8_t qh[8];      // per 32: the 2 high bits of its 4 indices
  uint8_t scales[8];  // per 32: two 4-bit scales
};
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[96];  // 64 grid indices (one per 4), then per 32 a u32: 4 x 7 sign bits and the scale (top 4)
};
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[64];     // low 8 bits of the grid indices (one per 4)
  uint8_t qh[8];      // their 9th bits
  uint8_t signs[32];  // one byte per 8
  uint8_t scales[4];  // per 64: two 4-bit scales (per 32)
};
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[32];  // low 8 bits of the grid indices (one per 8)
  uint16_t qh[8];  // per 32: 4 x 3 high index bits, the 3-bit scale (bits 12-14), delta's sign (bit 15)
};
struct BlockIQ1_M {
  uint8_t qs[32];     // low 8 bits of the grid indices
  uint8_t qh[16];     // per 16: 2 x (3 high index bits, delta's sign)
  uint8_t scales[8];  // 4 u16: 3-bit scales per 16 (bits 0-11), d's 16 bits in their top nibbles
};
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82);
static_assert(sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ1_S) == 50 && sizeof(BlockIQ1_M) == 56);

// IQ1_M's f16 scale, gathered from the top nibbles of its 4 scale words.
static inline uint16_t iq1m_d(const BlockIQ1_M& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

// IQ2's scale from a 4-bit code: ggml's d * (0.5 + s) * 0.25 (quant_decode.h's decode uses it too).
static inline float iq2_scale(float d, uint32_t s) {
  return d * (0.5f + s) * 0.25f;
}
// 8 values db * grid byte * (-1 where bit j of signs is set), ggml's operations in its order.
static inline void iq_signed8(float* y, float db, const int8_t* g, uint8_t signs) {
  for (int j = 0; j < 8; ++j) y[j] = db * (uint8_t)g[j] * (signs & (1 << j) ? -1.f : 1.f);
}
// IQ3's two 4-byte grid entries of 8 values side by side.
static inline void iq3_pair(int8_t* g, const std::array<int8_t, 4>& a, const std::array<int8_t, 4>& b) {
  std::memcpy(g, a.data(), 4);
  std::memcpy(g + 4, b.data(), 4);
}

static inline void dequant_block(const BlockIQ2_XXS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux[2];
    std::memcpy(aux, b.qs + 4 * ib, 8);
    const float db = iq2_scale(d, aux[1] >> 28);
    for (int l = 0; l < 4; ++l, y += 8)
      iq_signed8(y, db, kIq2xxsGrid[(aux[0] >> (8 * l)) & 0xff].data(), kIqSigns[(aux[1] >> (7 * l)) & 127]);
  }
}
static inline void dequant_block(const BlockIQ2_XS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {iq2_scale(d, b.scales[ib] & 0xf), iq2_scale(d, b.scales[ib] >> 4)};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint16_t q = b.qs[4 * ib + l];
      iq_signed8(y, db[l / 2], kIq2xsGrid[q & 511].data(), kIqSigns[q >> 9]);
    }
  }
}
static inline void dequant_block(const BlockIQ2_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint8_t *qs = b.qs, *signs = b.qs + 32;
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {iq2_scale(d, b.scales[ib] & 0xf), iq2_scale(d, b.scales[ib] >> 4)};
    for (int l = 0; l < 4; ++l, y += 8)
      iq_signed8(y, db[l / 2], kIq2sGrid[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)].data(), signs[l]);
    qs += 4;
    signs += 4;
  }
}
static inline void dequant_block(const BlockIQ3_XXS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint8_t* qs = b.qs;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux;
    std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
    const float db = d * (0.5f + (aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l, y += 8) {
      int8_t g[8];
      iq3_pair(g, kIq3xxsGrid[qs[2 * l]], kIq3xxsGrid[qs[2 * l + 1]]);
      iq_signed8(y, db, g, kIqSigns[(aux >> (7 * l)) & 127]);
    }
    qs += 8;
  }
}
static inline void dequant_block(const BlockIQ3_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint8_t *qs = b.qs, *qh = b.qh, *signs = b.signs;
  for (int ib = 0; ib < 8; ib += 2) {
    const float db[2] = {d * (1 + 2 * (b.scales[ib / 2] & 0xf)), d * (1 + 2 * (b.scales[ib / 2] >> 4))};
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 4; ++l, y += 8) {
        int8_t g[8];
        iq3_pair(g, kIq3sGrid[qs[2 * l] | ((qh[h] << (8 - 2 * l)) & 256)],
                 kIq3sGrid[qs[2 * l + 1] | ((qh[h] << (7 - 2 * l)) & 256)]);
        iq_signed8(y, db[h], g, signs[l]);
      }
      qs += 8;
      signs += 4;
    }
    qh += 2;
  }
}
static inline void dequant_block(const BlockIQ1_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint8_t* qs = b.qs;
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t h = b.qh[ib];
    const float dl = d * (2 * ((h >> 12) & 7) + 1);
    const float delta = h & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int l = 0; l < 4; ++l) {
      const auto& g = kIq1sGrid[qs[l] | (((h >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j) y[j] = dl * (g[j] + delta);
      y += 8;
    }
    qs += 4;
  }
}
static inline void dequant_block(const BlockIQ1_M& b, float* y) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  const float d = fp16_to_fp32(iq1m_d(b));
  const uint8_t *qs = b.qs, *qh = b.qh;
  for (int ib = 0; ib < 8; ++ib) {
    const float dl1 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1);
    const float dl2 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1);
    const uint16_t idx[4] = {
        (uint16_t)(qs[0] | ((qh[0] << 8) & 0x700)), (uint16_t)(qs[1] | ((qh[0] << 4) & 0x700)),
        (uint16_t)(qs[2] | ((qh[1] << 8) & 0x700)), (uint16_t)(qs[3] | ((qh[1] << 4) & 0x700))};
    const float delta[4] = {qh[0] & 0x08 ? -kIq1Delta : kIq1Delta, qh[0] & 0x80 ? -kIq1Delta : kIq1Delta,
                            qh[1] & 0x08 ? -kIq1Delta : kIq1Delta, qh[1] & 0x80 ? -kIq1Delta : kIq1Delta};
    for (int l = 0; l < 4; ++l) {
      const auto& g = kIq1sGrid[idx[l]];
      for (int j = 0; j < 8; ++j) y[j] = (l < 2 ? dl1 : dl2) * (g[j] + delta[l]);
      y += 8;
    }
    qs += 4;
    qh += 2;
  }
}

}  // namespace ultra
