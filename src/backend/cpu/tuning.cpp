// The CPU backend's one reader of the environment (tuning.h).
#include "backend/cpu/tuning.h"

#include <cstdlib>

namespace ultra::cpu {

namespace detail {
bool q8_int8_wanted(const char* value) {
  return !value || !*value || *value != '0';
}
}  // namespace detail

namespace {

// Set to a value that does not start with '0'.
bool set(const char* value) {
  return value && *value && *value != '0';
}

}  // namespace

CpuTuning read_cpu_tuning() {
  CpuTuning t;
  t.no_simd = set(std::getenv("ULTRA_NO_SIMD"));
  t.no_avx512 = set(std::getenv("ULTRA_NO_AVX512"));
  t.q8_int8 = detail::q8_int8_wanted(std::getenv("ULTRA_Q8_INT8"));
  t.panel_gemm = detail::q8_int8_wanted(std::getenv("ULTRA_CPU_PANEL"));
  return t;
}

const CpuTuning& cpu_tuning() {
  static const CpuTuning t = read_cpu_tuning();
  return t;
}

}  // namespace ultra::cpu
