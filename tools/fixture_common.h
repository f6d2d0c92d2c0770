// The fixture programs' shared pieces (quant_fixture_main.c, iq_fixture_main.c): a seeded LCG, a roughly
// normal value from it (the sum of four uniforms), and a checked write.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t fixture_rng;
static double uniform(void) {  // [0, 1)
  fixture_rng = fixture_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(fixture_rng >> 11) / 9007199254740992.0;
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
