// AVX-512 body of attention() (compiled with ULTRA_AVX512_ISA; called by attention.cpp when active_isa()
// is AVX-512): attention_kernel.h's loop on simd::Avx512 (16-float vectors: half the loads and FMAs of the
// AVX2 one for the scores and the weighted sum of v).
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined (as in matmul_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void attention_thread_avx512(const AttentionArgs& a, int ith, int nth) {
  attention_thread<simd::Avx512>(a, ith, nth);
}

}  // namespace ultra::cpu::detail
