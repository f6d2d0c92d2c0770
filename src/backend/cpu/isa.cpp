// Run-time choice of the kernels' instruction set (cpu_internal.h). Baseline x86-64 code.
#include <cpuid.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/tuning.h"

namespace ultra::cpu::detail {

namespace {

struct Features {
  bool avx2 = false;    // AVX, AVX2, FMA, F16C, with YMM state enabled by the OS
  bool avx512 = false;  // and AVX-512 F, BW, VL, DQ, with opmask/ZMM state enabled
  bool vnni = false;    // and AVX512-VNNI (int8 dot products: the *_vnni.cpp files)
};

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t)hi << 32 | lo;
}

// The features tested are exactly those the SIMD files are compiled with (CMakeLists.txt).
Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;  // and opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  f.avx2 = avx2 && fma && f16c && ymm_state;
  f.avx512 = f.avx2 && avx512f && avx512dq && avx512bw && avx512vl && zmm_state;
  f.vnni = f.avx512 && (c & (1u << 11));
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return features().avx2;
    case Isa::Avx512:
      return features().avx512;
  }
  return false;
}

bool cpu_has_avx2() {
  return cpu_supports(Isa::Avx2);
}

bool cpu_has_avx512() {
  return cpu_supports(Isa::Avx512);
}

bool cpu_has_avx512_vnni() {
  return features().vnni;
}

namespace {
int g_q8_int8_override = -1;
}

bool q8_int8_enabled() {
  if (g_q8_int8_override == 2) return true;
  const bool want = g_q8_int8_override >= 0 ? g_q8_int8_override == 1 : cpu_tuning().q8_int8;
  return want && active_isa() == Isa::Avx512 && cpu_has_avx512_vnni();
}

bool q8_int8_reference() {
  return g_q8_int8_override == 2;
}

void set_q8_int8_override(int on) {
  g_q8_int8_override = on;
}

Isa active_isa() {
  static const Isa isa = [] {
    if (cpu_tuning().no_simd || !cpu_supports(Isa::Avx2)) return Isa::Scalar;
    if (cpu_tuning().no_avx512 || !cpu_supports(Isa::Avx512)) return Isa::Avx2;
    return Isa::Avx512;
  }();
  return isa;
}

}  // namespace ultra::cpu::detail
