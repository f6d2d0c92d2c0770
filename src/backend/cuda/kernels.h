// CUDA kernels of the forward pass and the token sampler (Hopper, sm_90a), with small host launchers.
//
// Every launcher takes device pointers, shapes and a stream. None allocates, synchronizes or reads device
// data on the host, so every launch can be captured into a CUDA graph: whatever depends on data
// (positions, sequence ids, tokens, sampler parameters) is read by the kernels from device memory. Scratch
// memory comes from the caller, sized by the plan_* / *_workspace_bytes functions, which are called once
// (before capture) and may query the device.
//
// Activations are f32; weights F32 / F16 / BF16, or Q8_0 / F8_E4M3 / TERNARY in their device layout
// (gemv_lowbit.h: gemv, matmul and embed take them); KV cache F32 / F16 / BF16.
// Launchers return cudaErrorInvalidValue for a shape or type they do not support (decided from the
// arguments on the host, never from device data) and otherwise the launch status (cudaGetLastError).
//
// Each kernel's body is a __device__ function over one explicit tile (a block's worth of work) called by a
// thin __global__ wrapper, so that the bodies can later run inside one persistent kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/gemv_lowbit.h"
#include "core/views.h"

namespace ultra::cuda {

// ---- Device -------------------------------------------------------------------------------------------

struct DeviceInfo {
  int device = 0;
  int n_sms = 0;                // multiprocessors
  size_t l2_bytes = 0;          // L2 cache size
  size_t smem_optin_bytes = 0;  // largest dynamic shared memory one block may opt into
};
cudaError_t query_device(int device, DeviceInfo* out);

// ---- Launch mode ---------------------------------------------------------------------------------------
//
// The sampler's two kernels and gemv's split-K kernel (the choice for tall BF16 matrices at small n, see
// gemv) are launched with programmatic dependent launch (Hopper): such a kernel may start while the
// previous kernel of its stream is still running, and waits (griddepcontrol.wait) for that kernel's
// completion before it reads any data a kernel may have written and before it writes anything; in between
// it only issues its first weight loads (gemv), so its start-up and the weight stream overlap the previous
// kernel's tail. The one assumption: gemv weights (WeightView::data) are not written by kernels of the same
// stream (they are loaded once, by copies). Works inside graph capture. The attention kernels use it too
// (tuning::set_attention_pdl, on by default; they start their K / V copies of positions the step does not
// write before the wait). On by default; set_programmatic_launch(false) launches all of them the ordinary
// way (process-wide, for launches made afterwards).
void set_programmatic_launch(bool enabled);
bool programmatic_launch();
// Which kernels use it when it is on: 1 = the sampler, the split-K gemv and attention (unless
// tuning::set_attention_pdl(false)); 2 (the default) = also every row and elementwise op (embed, rmsnorm,
// silu_mul, add, gather_rows, convert_f32), RoPE, the KV write, rope_kv_write, the column-split gemv
// and the weight-streaming gemv, so that a decode step's chain of kernels overlaps each
// launch with the kernel before. Every one of these kernels waits before it reads activations and before it
// writes, and reads activations through L2 after the wait.
void set_programmatic_launch_level(int level);
int programmatic_launch_level();

// ---- Elementwise and row ops ---------------------------------------------------------------------------

// x[i, :] = row tokens[i] of tok_embd (F32 / F16 / BF16 [vocab, dim], or Q8_0 / F8_E4M3 / TERNARY in the
// device layout of gemv_lowbit.h: the f32 products decode * scale, as the CPU's dequant_row); a token outside
// [0, vocab) gives a zero row.
cudaError_t embed(const WeightView& tok_embd,
                  const int32_t* tokens,  // [n]
                  int n,
                  float* x,  // [n, dim]
                  cudaStream_t stream);

// out = x / sqrt(mean(x^2) + eps) * w, per row (sum of squares in f32). out may alias x.
cudaError_t rmsnorm(const float* x,  // [n, dim]
                    const float* w,  // [dim]
                    int n, int dim, float eps,
                    float* out,  // [n, dim]
                    cudaStream_t stream);

// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). out may alias gate or up.
cudaError_t silu_mul(const float* gate,  // [count]
                     const float* up,    // [count]
                     int64_t count,
                     float* out,  // [count]
                     cudaStream_t stream);

// x += y.
// Gemma's element-wise ops (gemma_ops.cu): out = gelu_tanh(gate) * up (tanhf, as PyTorch's approximate
// GELU); x *= s; x = cap tanh(x / cap).
cudaError_t gelu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream);
cudaError_t scale(float* x, int64_t count, float s, cudaStream_t stream);
cudaError_t softcap(float* x, int64_t count, float cap, cudaStream_t stream);
cudaError_t add(float* x,        // [count]
                const float* y,  // [count]
                int64_t count, cudaStream_t stream);

// out[r, :] = x[rows[r], :] (rows read from device memory; a negative row gives a zero row).
cudaError_t gather_rows(const float* x,       // [*, dim]
                        const int32_t* rows,  // [n_out]
                        int n_out, int dim,
                        float* out,  // [n_out, dim]
                        cudaStream_t stream);

// RoPE in place at positions pos[t], as cpu::rope: the angle of pair i is (float)pos * inv_freq[i] in f32;
// cos/sin and the rotation are evaluated in double (as rope_ref), so results match the CPU reference to
// f32 rounding. interleaved: pairs (2i, 2i+1) (llama.cpp "norm"); else (i, i + head_dim/2) (HF rotate_half).
// q and k are rotated by one launch; k may be null (n_kv_heads is then ignored). head_dim even, <= 1024.
cudaError_t rope(float* q,  // [n, n_heads, head_dim]
                 int n_heads,
                 float* k,  // [n, n_kv_heads, head_dim] or null
                 int n_kv_heads, int n, int head_dim,
                 const int32_t* pos,     // [n]
                 const float* inv_freq,  // [head_dim / 2]
                 bool interleaved, cudaStream_t stream,
                 float mscale = 1.0f);  // multiplies cos and sin (longrope's attention factor)

// Writes this step's k and v rows into the cache at (seq[t], head, pos[t]), converted to the cache type.
// Rows with seq[t] < 0 (padding), seq[t] >= n_slots or pos[t] outside [0, max_ctx) are skipped.
cudaError_t kv_write(const KvLayerView& kv,  // [n_slots, n_kv_heads, max_ctx, head_dim]
                     const float* k,         // [n, n_kv_heads, head_dim]
                     const float* v,         // [n, n_kv_heads, head_dim]
                     int n,
                     const int32_t* pos,  // [n]
                     const int32_t* seq,  // [n]
                     cudaStream_t stream);

// rope() on q and k, then kv_write() of the rotated k and of v, in one launch (one block per row). Same
// results as the two calls (k is rotated in place as well).
cudaError_t rope_kv_write(float* q,  // [n, n_heads, head_dim]
                          int n_heads,
                          float* k,        // [n, n_kv_heads, head_dim]
                          const float* v,  // [n, n_kv_heads, head_dim]
                          const KvLayerView& kv, int n,
                          const int32_t* pos,  // [n]
                          const int32_t* seq,  // [n]
                          const float* inv_freq, bool interleaved, cudaStream_t stream, float mscale = 1.0f);

// Converts f32 to F16 or BF16 (round to nearest even), e.g. activations for a tensor-core GEMM.
cudaError_t convert_f32(const float* x,  // [count]
                        int64_t count, GgmlType to,
                        void* out,  // [count] of `to`
                        cudaStream_t stream);

// ---- Matrix multiplication ---------------------------------------------------------------------------
//
// y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]); with accumulate, y += that (the residual add fused into the
// output and down projections). y must not alias x.

constexpr int kGemvMaxRows = 32;

enum class GemvPath {
  automatic,  // tensor cores when the shape allows it (cols % 8 == 0, 16-byte aligned rows and x), else simt
  tensor_core,  // fails with cudaErrorInvalidValue when the shape does not allow it
  simt,         // the plain fallback (any shape and alignment; slow for n > 4)
};

// Decode / small batch, 1 <= n <= kGemvMaxRows: streams every weight once for all n rows, f32 accuracy
// (~1e-6 relative) at tensor-core throughput, weights read with 16-byte streaming loads. Two tensor-core
// kernels, chosen by shape (docs/CUDA.md has the measurements):
//  * column-split (most shapes): mma.sync m16n8k8 TF32 with the weights exact in TF32 (F16 / BF16) and x
//    split into hi + lo TF32 parts (two products; F32 weights split as well: three); each block owns 16 or
//    32 rows and its 8 warps split the columns.
//  * split-K (BF16, >= 8192 rows and n <= 4, or >= 65536 rows and 9 <= n <= 16): blocks of 128 rows x a
//    column slice, clusters of up to 8 blocks add their partial sums in fixed order through distributed
//    shared memory; x staged once per block in three BF16 parts (m16n8k16 BF16 MMAs on the raw weights);
//    programmatic dependent launch (see set_programmatic_launch). Deterministic like the other.
// Q8_0 / F8_E4M3 / TERNARY weights (device layout, gemv_lowbit.h) go to gemv_lowbit (SIMT, weights
// dequantised in registers; path is ignored). gemv_rmsnorm and gemv_swiglu do not take them
// (cudaErrorInvalidValue / cudaErrorNotSupported, nothing launched: the caller runs the unfused ops).
cudaError_t gemv(const WeightView& w,  // [rows, cols], device memory
                 const float* x,       // [n, cols]
                 int n,
                 float* y,           // [n, rows]
                 const float* bias,  // [rows] or null
                 bool accumulate, cudaStream_t stream, GemvPath path = GemvPath::automatic);

// One row through the weight-streaming kernel (F16 / BF16 weights) with the op before the projection fused
// into how it forms x (gemv_stream.h): cudaErrorNotSupported, with nothing launched, where that kernel does
// not apply (other weight types or shapes, or the tuning switches it off); the caller then runs the two ops.
// y = W . (rmsnorm(x[*row]) * norm_w) + bias (+= y): bit-identical to gather_rows + rmsnorm + gemv (row
// null: row 0 of x; *row < 0: a zero row).
cudaError_t gemv_rmsnorm(const WeightView& w,  // [rows, cols]
                         const float* x,       // [*, cols]
                         const int32_t* row,   // [1] device memory, or null
                         const float* norm_w,  // [cols]
                         float eps,
                         float* y,           // [rows]
                         const float* bias,  // [rows] or null
                         bool accumulate, cudaStream_t stream);
// y = W . (silu(gate) * up) (+= y): bit-identical to silu_mul + gemv.
cudaError_t gemv_swiglu(const WeightView& w,  // [rows, cols]
                        const float* gate,    // [cols]
                        const float* up,      // [cols]
                        float* y,             // [rows]
                        bool accumulate, cudaStream_t stream);

// Matmul for any n: gemv for n <= kGemvMaxRows, else (prefill) cuBLASLt on tensor cores: x converted to the
// weight type (BF16 / F16) into the workspace, GEMM with f32 accumulation and f32 output, bias by the
// cuBLASLt epilogue, accumulate by beta = 1. F32 weights use an f32 GEMM (CUBLAS_COMPUTE_32F). Low-bit
// weights (Q8_0 / F8_E4M3 / TERNARY) are first dequantised to BF16 (lowbit_dequant_bf16, each weight the
// f32 product decode * scale rounded to BF16: 2^-9 relative, as the activations) into the end of the
// workspace, then run as BF16 weights. The cuBLASLt
// handle is created once by init(); matmul descriptors and the chosen algorithm are cached per shape on
// the host (the first call of a shape queries the heuristic; do it before capture to keep capture cheap).
// Not thread-safe: one CudaMatmul per host thread / stream.
class CudaMatmul {
 public:
  static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS' recommendation for Hopper
  // Device scratch for n <= max_n rows of at most max_cols columns: the cuBLASLt workspace plus the
  // converted activations, plus (max_n > kGemvMaxRows only) the BF16 copy of the largest low-bit matrix
  // that prefill multiplies: max_lowbit_elems = max over them of rows * lowbit_bf16_ld(cols) (0: none).
  static size_t workspace_bytes(int max_n, int64_t max_cols, int64_t max_lowbit_elems = 0);

  CudaMatmul() = default;
  ~CudaMatmul();
  CudaMatmul(const CudaMatmul&) = delete;
  CudaMatmul& operator=(const CudaMatmul&) = delete;

  // workspace: device memory of workspace_bytes(max_n, max_cols), owned by the caller, 256-byte aligned.
  cudaError_t init(void* workspace, size_t workspace_bytes);
  cudaError_t matmul(const WeightView& w,  // [rows, cols]
                     const float* x,       // [n, cols]
                     int n,
                     float* y,           // [n, rows]
                     const float* bias,  // [rows] or null
                     bool accumulate, cudaStream_t stream);
  // cublasStatus_t of the last cuBLAS(Lt) call that failed (0 if none), for error messages.
  int last_cublas_status() const { return last_status_; }

 private:
  struct Impl;
  Impl* impl_ = nullptr;
  int last_status_ = 0;
};

// ---- Attention ----------------------------------------------------------------------------------------
//
// Causal GQA attention over the slotted cache: row t, head h attends positions [0, pos[t]] of slot seq[t],
// kv head h / (n_heads / n_kv_heads). Rows with seq[t] < 0 (or pos[t] < 0) are padding: zero output.
// Rows with pos[t] >= max_ctx attend the whole slot. Optional sliding windows and soft-capped scores (per-row
// kernel only) and per-head sink logits (both kernels: out = sum_p e^(s_p - m) v_p / (sum_p e^(s_p - m) +
// e^(sink - m)), the sink term added where the sums are final: after the last tile, or in the merge).
// One block handles one row, one kv head, up to 8 query heads of its group and one chunk of positions:
// K and V are read once per (row, kv head) when the group is <= 8, each 64-position tile of K and V by two
// bulk copies into shared memory, two tiles in flight (QK^T on tensor cores as in gemv, f32 accurate;
// softmax and P.V in f32). The positions [0, pos[t]] are split into n_splits chunks (whole 64-position
// tiles; blocks whose chunk is empty exit at once); with n_splits > 1 each block writes a partial (max,
// sum, unnormalised output) to the workspace and a second kernel combines them (flash-decoding). n_splits
// is fixed by the plan, so one captured graph serves every context length.
// head_dim % 8 == 0, head_dim <= 256.
//
// Steps of n >= kAttentionTiledMinRows rows (prefill chunks) take a tiled causal kernel instead when the
// plan allows it (plan.tiled: F16 / BF16 cache, head_dim 64 or 128; q and out 16-byte aligned): a block
// takes a tile of 64 / H consecutive rows and H query heads of one kv head (H the largest power of two
// dividing the group, at most 16: 64 (row, head) pairs). A tile whose first and last rows are one sequence
// at consecutive positions (checked on the device) reads each 64-position K/V tile of [0, its last
// position] once for all of its rows and heads (cp.async into swizzled shared memory, two tiles in
// flight), S = QK^T and O += PV by mma.sync m16n8k16 with Q and P rounded to the cache's type (F16 or
// BF16), K and V as stored, f32 accumulation, online softmax in f32. The rows of other tiles (decode rows
// beside a chunk, a tile straddling two sequences) are taken by a fixed number of fallback blocks per kv
// head, rows f, f + F, f + 2F, ... of fallback block f, grouped by sequence so that rows of one sequence
// still share a pass. Any mix of rows is correct; only the speed depends on the rows being runs.
// Accuracy: Q and P carry the cache type's rounding (unit roundoff u = 2^-11 for F16, 2^-8 for BF16), so
// the output's relative error is about u (on the H200 with the test's random data: max |err| / max |ref|
// 0.24-2.05u per case, <= 2.22u for any single row and head), against ~1e-6 for the per-row kernel.
constexpr int kAttentionTiledMinRows = 33;
// The attention launch's tuning, fixed in its plan (the backend fills it from its CudaTuning; the
// overload of plan_attention without it takes the process-wide values of tuning.h's set_attention_*).
struct AttentionTuning {
  int tiled = 0;       // 0 automatic (the tiled kernel for n >= kAttentionTiledMinRows), 1 always the
                       // per-row kernel, 2 the tiled kernel for any n the plan allows
  int min_chunk = 64;  // the fewest positions one split takes (a multiple of 64)
  int max_stages = 0;  // K/V tiles in flight per block (0: as many as kStageBudget holds, up to 4)
  int trigger = 2;     // where the split kernel lets the next launch: 0 start, 1 after its tiles, 2 exit
  bool pdl = true;     // both attention kernels (and the tiled one) with programmatic launch
  bool combine_pdl = false;  // the merge kernel with programmatic launch even when pdl is off
  int stage = 0;             // timing only (wrong results unless 0): 1 the split kernel alone, 2 the merge
};
struct AttentionPlan {
  int n_heads = 0;
  int max_rows = 0;
  int n_splits = 1;
  size_t workspace_bytes = 0;     // for max_rows rows
  bool tiled = false;             // the tiled kernel supports this cache and head_dim (its limits are set)
  int tiled_fallback_blocks = 0;  // fallback blocks per (kv head, head chunk) of the tiled kernel
  AttentionTuning tuning;         // as planned (n_splits follows its max_stages)
};
// n_splits from the SM count, the rows and max_ctx (one wave of blocks for max_rows rows: 3 per SM for
// head_dim 128 F16; each split at least one 64-position tile of a full context, at most 256 splits);
// force_splits > 0 overrides it. Also sets the tiled kernel's shared-memory limit (call before capture).
AttentionPlan plan_attention(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                             int force_splits, const AttentionTuning& tuning);
AttentionPlan plan_attention(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                             int force_splits = 0);  // the process-wide tuning (process_attention_tuning)
// The values tuning.h's set_attention_* last set (their defaults: AttentionTuning's).
AttentionTuning process_attention_tuning();
// AttentionTuning::min_chunk for a wish of `positions`: rounded up to a multiple of 64, at least 64.
int attention_min_chunk(int positions);
// Whether attention(plan, ...) with n rows takes the tiled kernel (given q and out 16-byte aligned).
bool attention_tiled(const AttentionPlan& plan, int n);
cudaError_t attention(const AttentionPlan& plan, const KvLayerView& kv,
                      const float* q,      // [n, n_heads, head_dim]
                      int n,               // <= plan.max_rows
                      const int32_t* pos,  // [n]
                      const int32_t* seq,  // [n]
                      float scale,
                      float* out,       // [n, n_heads, head_dim]
                      void* workspace,  // plan.workspace_bytes (unused when n_splits == 1)
                      cudaStream_t stream,
                      float softcap = 0,  // > 0: scores softcap tanh(scale q.k / softcap) (Gemma 2)
                      int window = 0,     // > 0: row at p attends to positions > p - window only
                      // [n_heads] device memory or null: head h's softmax denominator also holds
                      // exp(sinks[h] - m), m its largest score (gpt-oss's attention sinks, cpu::attention's
                      // sinks), in both kernels
                      const float* sinks = nullptr);

// ---- Sampler ------------------------------------------------------------------------------------------
//
// Two kernels (greedy and top_k rows: a per-segment pass over many blocks, then one block per row that
// merges and finishes; other rows: the second kernel alone). The function computed (the CPU implements the
// same one):
//  a. A NaN or Inf among logits[0, n_sample) sets error = 1; the row then gets token 0, logprob NaN.
//  b. Penalties, for each distinct token t of the window hist[0, n_hist) seen c times (tokens outside
//     [0, n_sample) ignored): l_t = (l_t <= 0 ? l_t * repeat_penalty : l_t / repeat_penalty)
//                                    - (c * frequency_penalty + presence_penalty)   (f32, no FMA).
//  c. Greedy (temperature <= 0 or NaN): argmax of the penalised logits, ties to the lowest id; logprob =
//     log-softmax at temperature 1 (log-sum-exp: f32 exp terms summed in double); top-n: the n best
//     (logit desc, id asc) with their log-softmax.
//  d. Otherwise candidates in order (penalised logit desc, id asc); top-k (top_k <= 0 or >= n_sample: all);
//     e_j = exp((l_j - l_0) / T) in f32 (e_0 = 1, and 1 for any l_j == l_0); min-p keeps the prefix with
//     e_j >= min_p (when min_p > 0); top-p (when top_p < 1) keeps the smallest prefix whose cumulative
//     sum (double) >= top_p * (sum of kept, double); p_j = (float)(e_j * (1.0 / sum_kept)) (double
//     product); u = philox_uniform(seed, position, DrawStream::token); the token is the first j with
//     u * total < cumsum_j (total and cumsum of p in double); if none, the last kept j with p_j > 0.
//     logprob = (l_j - l_0) / T - log(sum_kept) in double; top-n from the kept candidates, best first.
// Sums in double are evaluated in a fixed parallel order (not the CPU's sequential one), and exp is
// CUDA's expf (<= 2 ulp): a decision can differ from the CPU's only when a compared quantity is within
// ~1e-6 relative of its threshold.
//
// Paths (a pass reads the row's logits once):
//  * greedy: the row is split into up to 64 segments of <= 8192 tokens (one 256-thread block each; fewer
//    when many rows share one wave of blocks): argmax candidates, top-n and a log-sum-exp partial per
//    segment; one block per row merges them (timings: docs/CUDA.md, "Greedy merge in the sampler").
//  * 1 <= top_k <= 1024 (top_k < n_sample): the same segments keep their top_k candidates (radix select
//    in shared memory, at most 16384 candidates per row in all); the merge compacts them to the top_k and
//    everything else is O(top_k) in shared memory.
//  * all tokens (top_k <= 0, >= n_sample, or > 1024), one block of 1024 threads per row, on one SM: a
//    pass for the max and top-n, a counting pass of
//    the min-p survivors (exact test, with the logit prefilter l >= l_max + T log(min_p) - margin); if at
//    most 8192 survive they are collected and finished as above (3 passes). Otherwise each of the
//    count-based top-k cut, the top-p cut and the draw is a threshold search over the vocabulary by
//    8-bit digits of the (logit, id) key with fixed-point (2^-44) bucket masses, 2-4 passes each, with
//    the last bucket collected and finished exactly: ~5-12 passes for flat distributions.
constexpr int kSamplerMaxProbs = 20;
constexpr int kSamplerMaxTopK = 1024;      // largest top_k of the one-pass path
constexpr int kSamplerMaxHistory = 32768;  // largest penalty window

// A kept distribution: n tokens best first with their probabilities (n <= kSamplerMaxTopK).
struct SpecDist {
  int32_t n;
  int32_t pad;
  int32_t id[kSamplerMaxTopK];
  float p[kSamplerMaxTopK];
};

constexpr int kRuleMaxBias = 300;  // biases per row: SamplingParams::kMaxLogitBias
struct RuleBias {                  // the layout of ultra::LogitBias
  int32_t token;
  float bias;  // added; <= -100: banned (-infinity)
};

struct SamplerRow {        // one per output row, in device memory (the engine fills it before a graph replay)
  float temperature;       // <= 0 or NaN: greedy
  int32_t top_k;           // <= 0 or >= n_sample: all tokens
  float top_p;             // >= 1: off
  float min_p;             // <= 0: off
  float repeat_penalty;    // 1: off
  float presence_penalty;  // 0: off
  float frequency_penalty;  // 0: off
  int32_t n_probs;          // top-n logprobs to report, 0..kSamplerMaxProbs
  uint64_t seed;
  int64_t position;     // Philox counter: position of the token being drawn
  const int32_t* hist;  // [n_hist] device memory: the penalty window (any order)
  int32_t n_hist;       // <= the plan's max_hist
  int32_t logits_row;   // row of the logits matrix to sample; < 0: skip (token -1, logprob NaN)
  // Speculative decoding; top_k rows only (1 <= top_k <= kSamplerMaxTopK, top_k < n_sample), greedy rows
  // ignore both (their distribution is the point mass on the argmax, which plain sampling draws).
  //  * propose: the row's kept (filtered) distribution, best first, is written here (Output::propose).
  //  * x: the proposed token (device memory): the row keeps it with probability min(1, p(x) / q(x)), p the
  //    row's kept distribution and q the proposal's (`q`, or a point mass on x when null); otherwise it
  //    draws from normalize(max(0, p - q)) (Philox streams DrawStream::accept and ::residual at `position`).
  //    The token is the kept x or that draw; its logprob the row's log p of it (Output::verify).
  SpecDist* propose;
  const int32_t* x;
  const SpecDist* q;
  // Logit rules (a grammar constraint's mask, a logit bias) of output row k, the row of this entry:
  // logit_rules() (backend_kernels.h) applies them to logits row k before the sampler runs, also for a row
  // that is not sampled (logits_row < 0: an Output::logits row, whose logits the host reads).
  const uint32_t* allow;  // bit t of word t / 32: token t allowed; pinned host memory read over the bus;
                          // 16-byte aligned, ceil(n_sample / 32) words rounded up to 4; null: no mask
  const RuleBias* bias;   // [n_bias] pinned host memory, applied in order (SamplingParams::logit_bias)
  int32_t n_bias;
  // Nonzero when the row has rules: its -infinity logits are the rules' (refused or banned tokens), not a
  // broken model's; the sampler takes them as probability 0 (logit_rules reports non-finite logits itself).
  int32_t rules;
};

struct SamplerOutputs {
  int32_t* token;      // [n_rows]
  float* logprob;      // [n_rows]
  int32_t* top_token;  // [n_rows, kSamplerMaxProbs]; unused entries -1; may be null
  float* top_logprob;  // [n_rows, kSamplerMaxProbs]; unused entries -inf; null iff top_token is
  int32_t* error;      // [n_rows] 1 when the row had a NaN / Inf logit, else 0
};

struct SamplerPlan {
  int max_rows = 0;
  int vocab = 0;
  int max_hist = 0;
  size_t workspace_bytes = 0;
  size_t smem_bytes = 0;
  int part_slots = 0;  // blocks of the per-segment pass the device holds at once (sizes its grid)
};
// Sets the kernel's shared-memory limit (call before capture). Fails when the device cannot give one
// block the shared memory that the vocabulary needs (about 80 KB + vocab / 8 bytes).
cudaError_t plan_sampler(const DeviceInfo& dev, int max_rows, int vocab, int max_hist, SamplerPlan* plan);
// The workspace holds per-row token counters that must start at zero; each launch leaves them at zero.
// Zero-fill once after allocating it (or after a launch failed).
cudaError_t sampler_workspace_init(const SamplerPlan& plan, void* workspace, cudaStream_t stream);
cudaError_t sample(const SamplerPlan& plan,
                   const float* logits,  // [*, ld], row SamplerRow::logits_row of each output row
                   int64_t ld,
                   int n_sample,            // <= plan.vocab, <= ld
                   const SamplerRow* rows,  // [n_rows] device memory
                   int n_rows,              // <= plan.max_rows
                   const SamplerOutputs& out, void* workspace, cudaStream_t stream);

}  // namespace ultra::cuda
