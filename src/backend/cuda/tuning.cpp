// The CUDA backend's one reader of the environment (tuning.h; docs/CUDA.md, "Tuning switches").
#include "backend/cuda/tuning.h"

#include <cstdlib>
#include <cstring>

namespace ultra::cuda {

namespace {

// The variable's value, or null when it is unset or empty.
const char* env(const char* name) {
  const char* e = std::getenv(name);
  return e && *e ? e : nullptr;
}

}  // namespace

CudaTuning read_cuda_tuning() {
  CudaTuning t;
  if (const char* e = env("ULTRA_CUDA_ATTENTION")) t.attention_rows = std::strcmp(e, "rows") == 0;
  if (const char* e = env("ULTRA_CUDA_PDL")) t.pdl = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_ATTENTION_PDL")) t.attention_pdl = *e != '0';
  if (const char* e = env("ULTRA_CUDA_FUSE")) t.fuse = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_GEMV")) t.gemv_set = true, t.gemv.kernel = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_GEMV_TRIGGER")) t.gemv_set = true, t.gemv.trigger = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_GEMV_SMEM")) t.gemv_set = true, t.gemv.smem_budget = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_GEMV_L2")) t.gemv_l2 = *e != '0';
  if (const char* e = env("ULTRA_CUDA_GEMV_L1")) t.gemv_l1 = *e != '0';
  if (const char* e = env("ULTRA_CUDA_ATTN_CHUNK")) t.attn_min_chunk = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_ATTN_COMBINE_PDL")) t.attn_combine_pdl = *e != '0';
  if (const char* e = env("ULTRA_CUDA_ATTN_TRIGGER")) t.attn_trigger = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_SKIP")) {
    t.skip_list = e;
    const std::string list = "," + t.skip_list + ",";
    const char* names[] = {"rmsnorm", "rope", "attention", "silu", "qkv", "o", "gate_up", "down", "lm_head"};
    for (int i = 0; i < 9; ++i)
      if (list.find(std::string(",") + names[i] + ",") != std::string::npos) t.skip |= 1u << i;
  }
  if (const char* e = env("ULTRA_CUDA_PROFILE")) t.profile = *e != '0';
  if (const char* e = env("ULTRA_CUDA_FP8_GEMM")) t.fp8_gemm = *e == '1';
  if (const char* e = env("ULTRA_CUDA_LB_TILE")) t.lb_tile = std::atoi(e);
  if (const char* e = env("ULTRA_CUDA_KQ_STAGE")) t.kq_stage = std::atoi(e) != 0;
  if (const char* e = env("ULTRA_CUDA_KQ_INT8")) t.kq_int8 = std::atoi(e) != 0;
  if (const char* e = env("ULTRA_CUDA_LOWBIT_TC")) t.lowbit_tc = *e != '0';
  if (const char* e = env("ULTRA_CUDA_LOWBIT_BULK")) t.lowbit_bulk = std::atoi(e);  // clamped where used
  if (const char* e = env("ULTRA_CUDA_LOWBIT_TC_BLOCKS"); e && std::atoi(e) > 0)
    t.lowbit_tc_blocks = std::atoi(e);
  return t;
}

const CudaTuning& kernel_tuning() {
  static const CudaTuning t = read_cuda_tuning();
  return t;
}

}  // namespace ultra::cuda
