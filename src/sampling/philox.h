// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the counter-based
// generator of cuRAND and JAX. A draw is a pure function of (key, counter): the sampler keys it by the
// sequence's seed and counts by the position of the token being drawn, so a sampled continuation depends
// only on the seed and the tokens, never on how many draws happened before. Rolling a sequence back needs
// no RNG state, and the CPU and the GPU draw the same numbers. Usable from host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ULTRA_HD __host__ __device__ __forceinline__
#else
#define ULTRA_HD inline
#endif

namespace ultra {

struct Philox4 {
  uint32_t v[4];
};

ULTRA_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

// Philox4x32 with 10 rounds: counter (c0..c3), key (k0, k1) -> 4 random 32-bit words.
ULTRA_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Streams of draws at one position (each its own counter word, so they are independent).
enum class DrawStream : uint32_t {
  token = 0,     // the sampled token
  accept = 1,    // speculative decoding: the acceptance test of a draft token
  residual = 2,  // speculative decoding: the draw from the residual distribution after a rejection
};

// A uniform double in [0, 1) with 53 random bits, for (seed, position, stream).
ULTRA_HD double philox_uniform(uint64_t seed, int64_t position, DrawStream stream) {
  const Philox4 r = philox4x32_10((uint32_t)position, (uint32_t)((uint64_t)position >> 32), (uint32_t)stream,
                                  0u, (uint32_t)seed, (uint32_t)(seed >> 32));
  const uint64_t bits = ((uint64_t)r.v[0] << 21) ^ (uint64_t)(r.v[1] >> 11);  // 32 + 21 = 53 bits
  return (double)(bits & ((1ull << 53) - 1)) * 0x1.0p-53;
}

}  // namespace ultra
