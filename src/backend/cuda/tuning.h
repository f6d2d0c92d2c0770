// Process-wide overrides of the kernels' automatic choices, for the benchmark and the tests only (not part
// of the launcher API the engine uses; not thread-safe: set them before launching).
#pragma once

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
  bool no_stream = false;  // automatic choice without the weight-streaming kernel (as before 2026-12-01)
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
extern int g_attention_stage, g_sampler_stage;
// Attention: at most this many K/V tiles in flight per block (0: automatic); the plan sizes its split count
// from the resulting blocks per SM, so call it before plan_attention.
void set_attention_stages(int stages);
extern int g_attention_stages;
// Attention: launch its two kernels with programmatic dependent launch (the default).
void set_attention_pdl(bool on);
extern bool g_attention_pdl;
// Attention: launch the merge kernel (attn_combine) with programmatic dependent launch; it lets the next
// kernel launch once its wait has returned (the split kernel is done), not at its start.
void set_attention_combine_pdl(bool on);
extern bool g_attention_combine_pdl;
// Where the split kernel lets the next kernel launch (programmatic launch): 0 at its start, 1 once its blocks
// have read their K / V tiles, 2 (the default) at their exit.
void set_attention_trigger(int where);
extern int g_attention_trigger;
// Attention: the fewest positions one split takes (rounded up to 64; default 64): rows up to this length run
// as one split per (row, kv head) with no merge kernel work. Measured on the H200 (docs/CUDA.md), 256 and
// 1024 were slower than 64 at depths 128 and 4096: more splits in flight beat the saved merge.
void set_attention_min_chunk(int positions);
extern int g_attention_min_chunk;
// Attention path: 0 automatic (attention_tiled), 1 always the per-row kernel, 2 the tiled kernel for any n
// when the plan allows it (plan.tiled).
void set_attention_tiled(int mode);
extern int g_attention_tiled;

// Prefill matmuls (CudaMatmul, n > 8) of F8_E4M3 weights with a scale per row or tensor: 0 as the
// environment says (ULTRA_CUDA_FP8_GEMM=1: cuBLASLt's FP8 GEMM with x quantised per row to E4M3; else the
// BF16 copy of the weights), 1 the FP8 GEMM, 2 the BF16 copy.
void set_fp8_gemm(int mode);
extern int g_fp8_gemm;

}  // namespace ultra::cuda::tuning
