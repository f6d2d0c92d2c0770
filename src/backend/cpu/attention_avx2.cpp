// AVX2+FMA+F16C body of attention() (compiled with ULTRA_AVX2_ISA; called by attention.cpp after the
// run-time check): attention_kernel.h's loop on simd::Avx2 (8-float vectors).
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void attention_thread_avx2(const AttentionArgs& a, int ith, int nth) {
  attention_thread<simd::Avx2>(a, ith, nth);
}

}  // namespace ultra::cpu::detail
