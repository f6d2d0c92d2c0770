// The CPU backend's tuning: its ULTRA_* variables, read from the environment by one function
// (read_cpu_tuning, tuning.cpp: the only getenv of the CPU backend). The kernel set is chosen once per
// process, so the kernels use cpu_tuning(), the first reading. docs/CORRECTNESS.md and docs/BENCHMARKS.md
// say what each switch is for.
#pragma once

namespace ultra::cpu {

struct CpuTuning {
  bool no_simd = false;    // ULTRA_NO_SIMD (set, not starting with '0'): the scalar reference kernels
  bool no_avx512 = false;  // ULTRA_NO_AVX512 (likewise): the AVX2 kernels on an AVX-512 CPU
  bool q8_int8 = true;     // ULTRA_Q8_INT8 (off for a value starting with '0'): Q8_0 with int8 activations
                           // where the kernels run AVX-512 with VNNI
  bool panel_gemm = true;  // ULTRA_CPU_PANEL (off likewise): prefill without the packed-panel GEMM (A/B)
};

// The environment now.
CpuTuning read_cpu_tuning();
// read_cpu_tuning() of the first call, fixed for the process.
const CpuTuning& cpu_tuning();

namespace detail {
// A switch that is on unless set to a value starting with '0' (ULTRA_Q8_INT8, ULTRA_CPU_PANEL; value is
// nullptr when unset).
bool q8_int8_wanted(const char* value);
}  // namespace detail

}  // namespace ultra::cpu
