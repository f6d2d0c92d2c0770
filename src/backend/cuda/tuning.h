// The CUDA backend's tuning: every ULTRA_CUDA_* variable read from the environment by one function
// (read_cuda_tuning, tuning.cpp: the only getenv of the CUDA backend) into CudaTuning, and the process-wide
// overrides of the kernels' automatic choices that the backend applies from it and that the benchmark and the
// tests set directly (not thread-safe: set them before launching). Defaults and what each switch measured:
// docs/CUDA.md, "Tuning switches".
#pragma once

#include <string>

namespace ultra::cuda::tuning {

struct GemvTuning {
  int kernel = 0;   // 0 automatic; 1 the column-split kernel; 2 the split-K kernel; 3 the weight-streaming
                    // kernel for n = 1, F16 / BF16 (gemv_stream.cu; else the column-split one)
  int mma = 0;      // 0 automatic; 1 TF32 hi + lo; 2 BF16 x three parts (BF16 weights only)
  int config = -1;  // -1 automatic; else an index below gemv_config_count() (BF16 weights only)
  int splits = 0;   // 0 automatic; else the split-K cluster size 1, 2, 4 or 8
  int smem_budget = 0;  // bytes of shared memory for the staged activations (split-K) or the weight stages
                        // (streaming kernel); 0 automatic
  int pf_steps = -1;    // 32-column steps kept requested into L2 ahead of the register ring; -1 automatic
  int trigger = 0;  // programmatic launch of the next kernel: 0 automatic, 1 at the start, 2 after the loads
                    // (both kernels)
};
void set_gemv_tuning(const GemvTuning& t);
// The column-split kernel: programmatic launch with x through L2 for every n (set_gemv_l2_all), or an
// ordinary launch with x through L1 for every n (set_gemv_l1_all); by default the first for n = 1, the second
// above.
void set_gemv_l2_all(bool on);
void set_gemv_l1_all(bool on);
int gemv_config_count();
const char* gemv_config_name(int config);

// Which of a two-kernel op's launches run (for timing the parts; results are garbage unless 0):
// 0 both, 1 the first only (attention: the split kernel; sampler: the per-segment pass), 2 the second only.
void set_attention_stage(int stage);
void set_sampler_stage(int stage);
extern int g_sampler_stage;
// Attention: the process-wide AttentionTuning (kernels.h) that plan_attention without one copies into the
// plans made after the call (a plan keeps the values it was made with; CudaBackend passes its own).
// At most this many K/V tiles in flight per block (0: automatic); the plan sizes its split count from the
// resulting blocks per SM.
void set_attention_stages(int stages);
// Both attention kernels with programmatic dependent launch (the default).
void set_attention_pdl(bool on);
// The merge kernel (attn_combine) with programmatic dependent launch; it lets the next kernel launch once its
// wait has returned (the split kernel is done), not at its start.
void set_attention_combine_pdl(bool on);
// Where the split kernel lets the next kernel launch (programmatic launch): 0 at its start, 1 once its blocks
// have read their K / V tiles, 2 (the default) at their exit.
void set_attention_trigger(int where);
// The fewest positions one split takes (rounded up to 64; default 64, docs/CUDA.md): rows up to this length
// run as one split per (row, kv head) with no merge kernel work.
void set_attention_min_chunk(int positions);
// Attention path: 0 automatic (attention_tiled), 1 always the per-row kernel, 2 the tiled kernel for any n
// when the plan allows it (plan.tiled).
void set_attention_tiled(int mode);

// Prefill matmuls (CudaMatmul, n > 8) of F8_E4M3 weights with a scale per row or tensor: 0 as the
// environment says (kernel_tuning().fp8_gemm, ULTRA_CUDA_FP8_GEMM=1: cuBLASLt's FP8 GEMM with x quantised per
// row to E4M3; else the BF16 copy of the weights), 1 the FP8 GEMM, 2 the BF16 copy.
void set_fp8_gemm(int mode);
extern int g_fp8_gemm;

}  // namespace ultra::cuda::tuning

namespace ultra::cuda {

// Every ULTRA_CUDA_* setting. A field at -1 ("unset") keeps the process-wide default.
struct CudaTuning {
  // ---- the backend's: the attention fields go into its AttentionPlans (kernels.h AttentionTuning), pdl and
  // the gemv fields to the process-wide switches above ----
  bool attention_rows = false;  // ULTRA_CUDA_ATTENTION=rows: prefill on the per-row attention kernel
  int pdl = -1;            // ULTRA_CUDA_PDL: programmatic launch 0 off, 1 the old subset, 2 all; -1 unset
  int attention_pdl = -1;  // ULTRA_CUDA_ATTENTION_PDL: 0 / 1 the attention kernels with it; -1 unset
  // ULTRA_CUDA_FUSE, a mask: 1 RoPE and the KV write in one kernel; for one-row steps into the x of the
  // weight-streaming gemv: 4 the rmsnorms before qkv and gate_up, 8 silu_mul, 16 the LM head's row gather and
  // rmsnorm. 29 (all) by default.
  int fuse = 29;
  bool gemv_set = false;      // any of ULTRA_CUDA_GEMV, _GEMV_TRIGGER, _GEMV_SMEM set: gemv applies
  tuning::GemvTuning gemv;    // kernel (ULTRA_CUDA_GEMV), trigger (_TRIGGER), smem_budget (_SMEM)
  int gemv_l2 = -1;           // ULTRA_CUDA_GEMV_L2: tuning::set_gemv_l2_all; -1 unset
  int gemv_l1 = -1;           // ULTRA_CUDA_GEMV_L1: tuning::set_gemv_l1_all; -1 unset
  int attn_min_chunk = -1;    // ULTRA_CUDA_ATTN_CHUNK: AttentionTuning::min_chunk; -1 unset
  int attn_combine_pdl = -1;  // ULTRA_CUDA_ATTN_COMBINE_PDL: AttentionTuning::combine_pdl; -1 unset
  int attn_trigger = -1;      // ULTRA_CUDA_ATTN_TRIGGER: AttentionTuning::trigger; -1 unset
  // ULTRA_CUDA_SKIP=op,op,...: those ops left out of every step (timing experiments only: results are wrong).
  enum : unsigned {
    kSkipRmsnorm = 1,
    kSkipRope = 2,  // RoPE and the KV write
    kSkipAttention = 4,
    kSkipSilu = 8,
    kSkipQkv = 16,
    kSkipO = 32,
    kSkipGateUp = 64,
    kSkipDown = 128,
    kSkipLmHead = 256
  };
  unsigned skip = 0;
  std::string skip_list;  // the variable's text (for the warning)
  bool profile = false;   // ULTRA_CUDA_PROFILE=1: steps op by op with events, a table at the end

  // ---- the kernels' own choices (process-wide, read once: kernel_tuning()) ----
  bool fp8_gemm = false;       // ULTRA_CUDA_FP8_GEMM=1: F8_E4M3 prefill through cuBLASLt's FP8 GEMM
  int lb_tile = 0;             // ULTRA_CUDA_LB_TILE=RU: gemv_lowbit's one-row tile (0 automatic)
  bool kq_stage = false;       // ULTRA_CUDA_KQ_STAGE=1: gemv_kquant stages x in shared memory
  bool kq_int8 = false;        // ULTRA_CUDA_KQ_INT8=1: block types' decode with int8 x (gemv_kquant_q8)
  bool lowbit_tc = true;       // ULTRA_CUDA_LOWBIT_TC=0: no tensor-core low-bit gemv
  int lowbit_bulk = -1;        // ULTRA_CUDA_LOWBIT_BULK=N: its bulk-copy slots (-1 automatic)
  int lowbit_tc_blocks = 132;  // ULTRA_CUDA_LOWBIT_TC_BLOCKS: the fewest blocks its tiling leaves
};

// The environment now (every backend reads it once, in its constructor).
CudaTuning read_cuda_tuning();
// read_cuda_tuning() of the first call: the kernels' own choices, fixed for the process.
const CudaTuning& kernel_tuning();

}  // namespace ultra::cuda
