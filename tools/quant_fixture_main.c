// Writes tests/fixtures/quants/ggml_ref.bin from llama.cpp's own ggml: a fixed f32 input (4 rows x 512, built
// to reach the formats' edges: zero, one-signed, tiny and outlier blocks) quantised by ggml_quantize_chunk
// (what llama-quantize calls) to each type, with and without importance weights, and ggml's to_float of the
// plain variant's blocks; plus ggml's block size and bytes of every type id. Built and run by
// tools/make_quant_fixtures.sh; read by tests/test_quants.cpp.
//
// Layout (little-endian): "UQFX" u32 version(1) u32 rows u32 cols u32 n_ids, then n_ids x (i64 blck, u64
// size) (0, 0 for ids ggml does not know), f32 input[rows*cols], f32 imatrix[cols], u32 n_types, then per
// type: u32 id, u64 row_bytes, plain blocks [rows*row_bytes], imatrix blocks [rows*row_bytes], f32
// dequantised plain blocks [rows*cols].
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_common.h"
#include "ggml.h"

// Exported by libggml-base but not declared in ggml.h (the type traits leave Q8_K's from_float_ref to the CPU
// backend): the reference quantiser of the k-quants' activation type.
void quantize_row_q8_K_ref(const float* x, void* y, int64_t k);
void dequantize_row_q8_K(const void* x, float* y, int64_t k);

enum { ROWS = 4, COLS = 512 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT\n", argv[0]);
    return 2;
  }
  fixture_rng = 0x9e3779b97f4a7c15ull;
  static float x[ROWS * COLS], imat[COLS];
  for (int c = 0; c < COLS; ++c) {
    x[0 * COLS + c] = normalish();
    x[1 * COLS + c] = 0.02f * normalish() * (c % 37 == 0 ? 20.0f : 1.0f);
    const int blk = c / 32;
    x[2 * COLS + c] = blk == 0   ? 0.0f
                      : blk == 1 ? -fabsf(normalish())
                      : blk == 2 ? 1e-6f * normalish()
                      : blk == 3 ? 3e-9f * normalish()
                                 : normalish() * (float)(1 + blk);
    x[3 * COLS + c] = uniform() < 0.2 ? 100.0f * normalish() : 0.5f * normalish();
    imat[c] = 0.1f + (float)(c % 17) / 4.0f;
  }
  const enum ggml_type types[] = {GGML_TYPE_Q4_0,  GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,   GGML_TYPE_Q5_1,
                                  GGML_TYPE_Q8_0,  GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,
                                  GGML_TYPE_Q5_K,  GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
                                  GGML_TYPE_MXFP4, GGML_TYPE_Q8_K};
  const uint32_t n_types = sizeof(types) / sizeof(types[0]);
  FILE* f = fopen(argv[1], "wb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  const uint32_t head[5] = {0x58465155u /* "UQFX" */, 1, ROWS, COLS, GGML_TYPE_COUNT};
  put(f, head, sizeof head);
  for (int id = 0; id < GGML_TYPE_COUNT; ++id) {
    const struct ggml_type_traits* tt = ggml_get_type_traits((enum ggml_type)id);
    int64_t blck = tt && tt->type_name && tt->blck_size > 0 ? tt->blck_size : 0;
    uint64_t size = blck ? (uint64_t)tt->type_size : 0;
    put(f, &blck, 8);
    put(f, &size, 8);
  }
  put(f, x, sizeof x);
  put(f, imat, sizeof imat);
  put(f, &n_types, 4);
  for (uint32_t i = 0; i < n_types; ++i) {
    const enum ggml_type t = types[i];
    const struct ggml_type_traits* tt = ggml_get_type_traits(t);
    const uint64_t rb = ggml_row_size(t, COLS);
    uint8_t* q = calloc(ROWS, rb);
    uint8_t* qi = calloc(ROWS, rb);
    float* y = calloc(ROWS * COLS, sizeof(float));
    if (t == GGML_TYPE_Q8_K) {  // an activation type: ggml quantises it with from_float_ref only
      for (int r = 0; r < ROWS; ++r) quantize_row_q8_K_ref(x + r * COLS, q + r * rb, COLS);
      memcpy(qi, q, ROWS * rb);
    } else {
      ggml_quantize_chunk(t, x, q, 0, ROWS, COLS, NULL);
      ggml_quantize_chunk(t, x, qi, 0, ROWS, COLS, imat);
    }
    for (int r = 0; r < ROWS; ++r) {
      if (t == GGML_TYPE_Q8_K)
        dequantize_row_q8_K(q + r * rb, y + r * COLS, COLS);
      else
        tt->to_float(q + r * rb, y + r * COLS, COLS);
    }
    const uint32_t id = (uint32_t)t;
    put(f, &id, 4);
    put(f, &rb, 8);
    put(f, q, ROWS * rb);
    put(f, qi, ROWS * rb);
    put(f, y, ROWS * COLS * sizeof(float));
    free(q);
    free(qi);
    free(y);
  }
  fclose(f);
  ggml_quantize_free();
  return 0;
}
