// Writes tests/fixtures/quants/ggml_iq_ref.bin from llama.cpp's own ggml: a fixed f32 input (4 rows x 1024:
// normal values, small values with outliers, a row with zero / one-signed / tiny blocks, a row with large
// outliers) quantised by ggml_quantize_chunk with importance weights (these formats require them) to each
// grid i-quant (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), and ggml's to_float of the blocks.
// Built and run by tools/make_quant_fixtures.sh; read by tests/test_quants.cpp.
//
// Layout (little-endian): "UQIQ" u32 version(1) u32 rows u32 cols u32 n_types, then per type: u32 id,
// u64 row_bytes, blocks [rows*row_bytes], f32 dequantised [rows*cols].
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"

enum { ROWS = 4, COLS = 1024 };

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double uniform(void) {  // [0, 1)
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static float normalish(void) {
  double s = 0;
  for (int i = 0; i < 4; ++i) s += uniform();
  return (float)((s - 2.0) * 1.7);
}
static void put(FILE* f, const void* p, size_t n) {
  if (fwrite(p, 1, n, f) != n) {
    perror("write");
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT\n", argv[0]);
    return 2;
  }
  static float x[ROWS * COLS], imat[COLS];
  for (int c = 0; c < COLS; ++c) {
    x[0 * COLS + c] = normalish();
    x[1 * COLS + c] = 0.02f * normalish() * (c % 37 == 0 ? 20.0f : 1.0f);
    const int blk = c / 32;
    x[2 * COLS + c] = blk == 0 ? 0.0f : blk == 1 ? -fabsf(normalish()) : blk == 2 ? 1e-6f * normalish()
                                                                                   : normalish() * (float)(1 + blk % 7);
    x[3 * COLS + c] = uniform() < 0.2 ? 100.0f * normalish() : 0.5f * normalish();
    imat[c] = 0.1f + (float)(c % 17) / 4.0f;
  }
  const enum ggml_type types[] = {GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS,
                                  GGML_TYPE_IQ3_S,   GGML_TYPE_IQ1_S,  GGML_TYPE_IQ1_M};
  const uint32_t n_types = sizeof(types) / sizeof(types[0]);
  FILE* f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  const uint32_t head[5] = {0x51495155u /* "UQIQ" */, 1, ROWS, COLS, n_types};
  put(f, head, sizeof head);
  for (uint32_t i = 0; i < n_types; ++i) {
    const enum ggml_type t = types[i];
    const uint64_t rb = ggml_row_size(t, COLS);
    uint8_t* q = calloc(ROWS, rb);
    float* y = calloc(ROWS * COLS, sizeof(float));
    ggml_quantize_init(t);
    ggml_quantize_chunk(t, x, q, 0, ROWS, COLS, imat);
    for (int r = 0; r < ROWS; ++r) ggml_get_type_traits(t)->to_float(q + r * rb, y + r * COLS, COLS);
    const uint32_t id = (uint32_t)t;
    put(f, &id, 4);
    put(f, &rb, 8);
    put(f, q, ROWS * rb);
    put(f, y, ROWS * COLS * sizeof(float));
    free(q);
    free(y);
  }
  fclose(f);
  ggml_quantize_free();
  return 0;
}
