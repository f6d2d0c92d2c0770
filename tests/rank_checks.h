// The pass / fail bookkeeping of the programs run by mpirun (or forked) as several ranks (tests/dist,
// tests/gpu/test_nccl_comm): each rank counts its checks and prints its failures; and each rank's data, a
// known function of the rank that every rank can compute for all; the allocation check of their collectives.
// Include in one file of a program (alloc_counter.h's rule).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>

#include "alloc_counter.h"

namespace {

int g_pass = 0, g_fail = 0, g_rank = 0;

void check(bool ok, const std::string& what) {
  (ok ? g_pass : g_fail)++;
  if (!ok) std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
}

// Rank r's i-th value: distinct per rank and index, not exactly summable in f32 in every order.
float value(int r, size_t i) {
  return std::sin(0.37f * (float)(i + 1) + 1.3f * (float)r) * (1.0f + 0.001f * (float)r) + 1e-3f * (float)i;
}

// Counts this thread's allocations over three windows of window() (after the caller's warm-up of the same
// pattern): at least one window must have none (Open MPI grows a free list once in a while, NCCL may too).
template <class F>
void check_no_allocation(const std::string& what, F&& window) {
#if ULTRA_COUNT_ALLOCS
  count_this_thread();
  long counts[3];
  for (long& c : counts) {
    AllocCount ac;
    window();
    ac.stop();
    c = g_allocs_mine.load();
  }
  check(std::min({counts[0], counts[1], counts[2]}) == 0,
        what + " allocate nothing on the calling thread (windows: " + std::to_string(counts[0]) + ", " +
            std::to_string(counts[1]) + ", " + std::to_string(counts[2]) + ")");
#endif
}

}  // namespace
