// Writes the TQ1_0 / TQ2_0 fixture (see make_tq_fixtures.sh; read by tests/test_lowbit.cpp). Little-endian:
//   "TQFX", u32 n_rows, u32 n (columns, a multiple of 256)
//   f32 x[n_rows * n]                      inputs (a fixed LCG, plus rows of ties, zeros, tiny and huge
//   values) block_tq1_0[n_rows * n / 256]           quantize_row_tq1_0_ref(x) block_tq2_0[n_rows * n / 256]
//   quantize_row_tq2_0_ref(x) f32 [n_rows * n]                       dequantize_row_tq1_0 of those blocks f32
//   [n_rows * n]                       dequantize_row_tq2_0 of those blocks u32 n_raw; block_tq1_0[n_raw];
//   f32[n_raw * 256]; block_tq2_0[n_raw]; f32[n_raw * 256]
//                                          random bytes as blocks (every digit pattern, TQ2_0 code 3) and
//                                          their dequantisation
#include <stdio.h>
#include <stdlib.h>

void quantize_row_tq1_0_ref(const float* x, block_tq1_0* y, int64_t k);
void quantize_row_tq2_0_ref(const float* x, block_tq2_0* y, int64_t k);
void dequantize_row_tq1_0(const block_tq1_0* x, float* y, int64_t k);
void dequantize_row_tq2_0(const block_tq2_0* x, float* y, int64_t k);

static uint64_t s = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(s >> 32);
}
static float next_f(void) {  // uniform in [-1, 1)
  return (float)((double)next_u32() / 4294967296.0 * 2.0 - 1.0);
}

int main(int argc, char** argv) {
  enum { n_rows = 6, n = 512, n_raw = 8 };
  static float x[n_rows * n], d1[n_rows * n], d2[n_rows * n];
  static block_tq1_0 q1[n_rows * n / 256];
  static block_tq2_0 q2[n_rows * n / 256];
  for (int r = 0; r < n_rows; ++r) {
    for (int c = 0; c < n; ++c) {
      float v = next_f();
      if (r == 1)
        v = (c % 4 == 0) ? 1.0f : (c % 4 == 1) ? 0.5f : (c % 4 == 2) ? -0.5f : 0.25f;  // ties of round
      if (r == 2) v = 0.0f;
      if (r == 3) v *= 1e-6f;
      if (r == 4) v = v * v * v * 3e4f;  // heavy-tailed: most round to 0
      x[r * n + c] = v;
    }
  }
  quantize_row_tq1_0_ref(x, q1, n_rows * n);
  quantize_row_tq2_0_ref(x, q2, n_rows * n);
  dequantize_row_tq1_0(q1, d1, n_rows * n);
  dequantize_row_tq2_0(q2, d2, n_rows * n);
  static block_tq1_0 r1[n_raw];
  static block_tq2_0 r2[n_raw];
  static float rd1[n_raw * 256], rd2[n_raw * 256];
  for (int b = 0; b < n_raw; ++b) {
    for (size_t i = 0; i < sizeof(r1[b].qs); ++i) r1[b].qs[i] = (uint8_t)next_u32();
    for (size_t i = 0; i < sizeof(r1[b].qh); ++i) r1[b].qh[i] = (uint8_t)next_u32();
    for (size_t i = 0; i < sizeof(r2[b].qs); ++i) r2[b].qs[i] = (uint8_t)next_u32();
    r1[b].d = GGML_FP32_TO_FP16(0.5f + b);
    r2[b].d = GGML_FP32_TO_FP16(0.25f + b);
  }
  for (int i = 0; i < 256; ++i) r1[0].qs[i % 48] = (uint8_t)i;  // every byte value in the first blocks
  for (int i = 0; i < 64; ++i) r2[0].qs[i] = (uint8_t)(i * 4 + 3);
  dequantize_row_tq1_0(r1, rd1, n_raw * 256);
  dequantize_row_tq2_0(r2, rd2, n_raw * 256);
  FILE* f = fopen(argv[1], "wb");
  if (!f) return 1;
  const uint32_t hdr[2] = {n_rows, n}, nr = n_raw;
  fwrite("TQFX", 1, 4, f);
  fwrite(hdr, 4, 2, f);
  fwrite(x, 4, n_rows * n, f);
  fwrite(q1, sizeof(block_tq1_0), n_rows * n / 256, f);
  fwrite(q2, sizeof(block_tq2_0), n_rows * n / 256, f);
  fwrite(d1, 4, n_rows * n, f);
  fwrite(d2, 4, n_rows * n, f);
  fwrite(&nr, 4, 1, f);
  fwrite(r1, sizeof(block_tq1_0), n_raw, f);
  fwrite(rd1, 4, n_raw * 256, f);
  fwrite(r2, sizeof(block_tq2_0), n_raw, f);
  fwrite(rd2, 4, n_raw * 256, f);
  return fclose(f) != 0;
}
