// Mixture-of-experts kernels (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss) for the CUDA backend: the router's
// softmax and top-k, the grouping of (row, expert) pairs by expert, the experts' SwiGLU FFN over their own
// rows only, and the weighted sum back into the residual stream. Every launch has a shape fixed by the number
// of rows (the expert choice is data read on the device), so a step with experts is captured into a graph
// like any other.
//
// The FFN of n rows with k experts each, the n * k (row, slot) pairs:
//   moe_group:   pairs sorted by expert (counting sort, rows ascending within an expert), cut into tiles of
//                up to kMoeTilePairs pairs of one expert: tile t = (expert, first pair, pairs);
//   moe_gate_up: per tile, h[p] = silu(W_gate[e] . xn[row p]) * (W_up[e] . xn[row p]) for its pairs, each
//                weight row read once for the whole tile;
//   moe_down:    per tile, y[p] = W_down[e] . h[p];
//   moe_combine: x[r] += sum_j w[r, j] * y[pair of (r, j)], j in slot order (the CPU's order).
// Steps of more than kMoeExactMaxRows rows (prefill) run gate / up and down on tensor cores instead (mma.sync
// BF16, f32 accumulation, tiles of up to 64 pairs x 64 weight rows), as the dense matmuls go to cuBLASLt
// there. Decode (n = 1, after moe_route made the tiles) runs two kernels: gate / up over a tile per slot,
// then the down projection and the weighted sum in one pass (a warp per output element, the experts in slot
// order). Decode reads exactly the k selected experts' weights once. Arithmetic in f32, weights decoded in
// registers (F32, F16, BF16, Q8_0 and MXFP4 in their device layouts).
// gpt-oss: every product adds its expert's bias (ExpertWeights::bias, after the f32 dot product, as the
// CPU's matmul), the activation is the clamped SwiGLU (swiglu_limit > 0: cpu::swiglu_oai) instead of
// silu(gate) * up, and the routing is moe_route_topk_softmax.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/views.h"

namespace ultra::cuda {

constexpr int kMoeTilePairs = 8;      // pairs of one expert that share each weight read (up to 32 rows)
constexpr int kMoeExactMaxRows = 32;  // steps up to this many rows: f32 products; above: BF16 tensor cores
constexpr int kMoeMaxExperts = 1024;  // moe_group runs one thread per expert in one block
constexpr int kMoeMaxRouted = 256;    // moe_route keeps a row's router logits in registers (8 per lane)
constexpr int kMoeMaxUsed = 32;       // experts per row: moe_route keeps slot j in lane j

// The n_expert matrices of one kind of one layer, back to back in device memory: expert e's row r at
// data + e * expert_bytes + r * row_bytes (row_bytes: the dense row, or the Q8_0 device row of
// gemv_lowbit.h).
struct ExpertWeights {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0;  // per expert
  int64_t cols = 0;
  size_t row_bytes = 0;
  size_t expert_bytes = 0;
  int n_expert = 0;
  const float* bias = nullptr;  // [n_expert, rows] f32 device memory (gpt-oss), or null: none
};

// gpt-oss's MXFP4 experts in the expert kernels' device layout: per row the E2M1 codes in column order
// (column 2i in the low nibble of byte i, 2i + 1 in the high one: cols / 2 bytes), then the row's E8M0
// exponents (one per 32 columns), zero-padded to a multiple of 16 bytes: 4.25 bits a weight and the
// padding (gpt-oss-20b's 2880 columns: 1536 bytes a row). Decoded in registers as core/quants.h's
// dequant_block (exact values).
size_t moe_mxfp4_row_bytes(int64_t cols);  // 0 unless cols is a positive multiple of 32
// Column c0 + i (i < 8, c0 a multiple of 8) of such a row, from the 4 bytes of codes at row + c0 / 2 (q,
// little-endian: column c0 + i in bits 4i..4i+3) and the exponent byte e at row + cols / 2 + c0 / 32: as
// core/quants.h's dequant_block, kFp4Values[code] (twice E2M1's value) times 0.5 * 2^(e - 127), the same
// f32 operations. The expert kernels' decoder, and the host tests'.
__host__ __device__ inline float moe_mxfp4_value(uint32_t q, uint32_t e, int i) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
#ifdef __CUDA_ARCH__
  const float d = __uint_as_float(bits);
#else
  float d;
  __builtin_memcpy(&d, &bits, 4);
#endif
  const uint32_t code = (q >> (4 * i)) & 0xFu;
  const int mag = (int)((0xC8643210u >> (4 * (code & 7u))) & 0xFu);  // 0 1 2 3 4 6 8 12
  return (float)(code & 8u ? -mag : mag) * d;
}
// Host: rows [r0, r1) of the MXFP4 view w (ggml's block_mxfp4 rows, as the loaders give them) into out
// [(r1 - r0) * moe_mxfp4_row_bytes(w.cols)]. False if w is not such a view or the rows are out of range.
bool moe_pack_mxfp4_rows(const WeightView& w, int64_t r0, int64_t r1, void* out);

// Whether the expert kernels take this matrix type and shape (cols a multiple of 8, 16-byte rows; Q8_0 and
// MXFP4: cols a multiple of 32).
bool moe_weights_ok(const ExpertWeights& w);

// Scratch of moe_ffn for up to n_rows rows, device memory; moe_scratch_bytes gives its size.
struct MoeScratch {
  int32_t* tiles = nullptr;      // [max_tiles * 3] (expert, first pair, pairs) of each tile
  int32_t* n_tiles = nullptr;    // [1]
  int32_t* pair_row = nullptr;   // [n_rows * k] the row of each sorted pair
  int32_t* slot_pair = nullptr;  // [n_rows * k] the sorted pair of (row r, slot j), at r * k + j (-1: none)
  float* h = nullptr;            // [n_rows * k, ffn] silu(gate) * up of each pair
  float* y = nullptr;            // [n_rows * k, dim] each pair's expert output
};
int64_t moe_max_tiles(int n_pairs, int n_expert, int tile_pairs = kMoeTilePairs);
size_t moe_scratch_bytes(int n_rows, int k, int n_expert, int ffn, int dim);
MoeScratch moe_scratch(void* mem, int n_rows, int k, int n_expert, int ffn, int dim);  // carves mem

// The router's logits [n, n_expert] = xn [n, dim] . R^T, R [n_expert, dim] given as one "expert"
// (r.n_expert = 1, r.rows = the number of experts; r.bias [n_expert] added when set: gpt-oss), in f32 at
// every n: the expert choice must not depend on the step size (the dense matmuls round activations to BF16
// above 32 rows, and a BF16 copy of a low-bit matrix serves 5..32 rows; either can flip a near tie of router
// logits).
cudaError_t moe_router(const ExpertWeights& r, const float* xn, int n, float* logits, cudaStream_t stream);

// model/moe.h's moe_route on the device: logits [n, n_expert] (overwritten with the softmax probabilities)
// -> ids [n, k] (descending probability, ties to the lower expert), w [n, k] (renormalised when norm). One
// warp per row; n_expert <= kMoeMaxRouted, 1 <= k <= min(n_expert, kMoeMaxUsed).
// decode_tiles (n == 1 only): also writes moe_ffn's grouping of the row's k pairs into it (a tile per slot),
// so that moe_ffn(..., tiles_ready = true) skips moe_group and runs the one-row kernels.
cudaError_t moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w,
                      cudaStream_t stream, const MoeScratch* decode_tiles = nullptr);

// model/moe.h's moe_route_topk_softmax on the device (gpt-oss): ids [n, k] the experts of the k largest
// logits [n, n_expert] (descending, ties to the lower expert, NaN last), w [n, k] the softmax of those k
// logits (in f32, summed in slot order as the CPU). logits are left as they are. Limits and decode_tiles as
// moe_route.
cudaError_t moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w,
                                   cudaStream_t stream, const MoeScratch* decode_tiles = nullptr);

// x[n, dim] += the experts' FFN of xn[n, dim], as described above. gate / up: [ffn, dim] per expert, down:
// [dim, ffn] per expert, all of one type, each with its bias or none. swiglu_limit > 0: the activation is
// swiglu_oai(gate, up) with that limit (gpt-oss), else silu(gate) * up.
cudaError_t moe_ffn(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                    const float* xn, int n, const int32_t* ids, const float* w, int k, float* x,
                    const MoeScratch& s, cudaStream_t stream, bool tiles_ready = false,
                    float swiglu_limit = 0.0f);

// x[r] += sigmoid(gate_w . xn[r]) * y[r] for n rows of dim floats (Qwen2-MoE's shared expert). One warp per
// row.
cudaError_t sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim, float* x,
                             cudaStream_t stream);

// Timing experiments (test_cuda_moe --bench): the one-row step's gate / up GEMV with gate_unroll chunks of
// each row in flight per lane (2, 8; 0: the default 4) and its down projection with down_rows output elements
// per warp (1, 4; 0: the default 2).
void set_moe_decode_tiles(int gate_unroll, int down_rows);

}  // namespace ultra::cuda
