#include "backend/cuda/cuda_ops.h"

#include "backend/cuda/device_memory.h"

namespace ultra::cuda {

unsigned CudaOps::skip_bit(MatmulOp op) {
  switch (op) {
    case MatmulOp::q:
    case MatmulOp::k:
    case MatmulOp::v:
      return CudaTuning::kSkipQkv;
    case MatmulOp::o:
      return CudaTuning::kSkipO;
    case MatmulOp::gate:
    case MatmulOp::up:
    case MatmulOp::gate_shexp:
    case MatmulOp::up_shexp:
      return CudaTuning::kSkipGateUp;
    case MatmulOp::down:
    case MatmulOp::down_shexp:
      return CudaTuning::kSkipDown;
    case MatmulOp::lm_head:
      return CudaTuning::kSkipLmHead;
    case MatmulOp::router:
      return 0;
  }
  return 0;
}

void CudaOps::embed(const WeightView& table, const int32_t* tokens, int n, float* x) {
  check(cuda::embed(table, tokens, n, x, stream_), "embed");
}
void CudaOps::rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) {
  if (tune_.skip & CudaTuning::kSkipRmsnorm) return;
  check(cuda::rmsnorm(x, w, n_rows, dim, eps, out, stream_), "rmsnorm");
}
void CudaOps::matmul(MatmulOp op, const WeightView& w, const float* x, int n, float* y, const float* bias,
                     bool accumulate) {
  if (tune_.skip & skip_bit(op)) return;
  check(mem_.mm->matmul(w, x, n, y, bias, accumulate, stream_), "matmul");
}
void CudaOps::rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim,
                   const int32_t* pos, bool interleaved) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  check(cuda::rope(q, n_heads, k, n_kv_heads, n, head_dim, pos, w_.layer_inv_freq(il), interleaved, stream_,
                   w_.rope_mscale()),
        "rope");
}
void CudaOps::kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                       const int32_t* seq) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  check(cuda::kv_write(mem_.kv[il], k, v, n, pos, seq, stream_), "kv_write");
}
void CudaOps::attention(int il, const float* q, int n, int /*n_heads*/, const int32_t* pos,
                        const int32_t* seq, float scale, float softcap, int window, float* out) {
  if (tune_.skip & CudaTuning::kSkipAttention) return;
  check(cuda::attention(*plan_, mem_.kv[il], q, n, pos, seq, scale, out, mem_.attention_ws, stream_, softcap,
                        window),
        "attention");
}
void CudaOps::attention_sinks(int il, const float* q, int n, int /*n_heads*/, const int32_t* pos,
                              const int32_t* seq, float scale, int window, const float* sinks, float* out) {
  if (tune_.skip & CudaTuning::kSkipAttention) return;
  check(cuda::attention(*plan_, mem_.kv[il], q, n, pos, seq, scale, out, mem_.attention_ws, stream_, 0.0f,
                        window, sinks),
        "attention");
}
void CudaOps::gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  check(cuda::gelu_mul(gate, up, n, out, stream_), "gelu_mul");
}
void CudaOps::scale(float* x, int64_t n, float s) {
  check(cuda::scale(x, n, s, stream_), "scale");
}
void CudaOps::softcap(float* x, int64_t n, float cap) {
  check(cuda::softcap(x, n, cap, stream_), "softcap");
}
// x += rmsnorm(y) * w (y is scratch: normed in place).
void CudaOps::norm_add(float* y, const float* w, int n_rows, int dim, float eps, float* x) {
  check(cuda::rmsnorm(y, w, n_rows, dim, eps, y, stream_), "rmsnorm");
  check(cuda::add(x, y, (int64_t)n_rows * dim, stream_), "add");
}
void CudaOps::qkv(int il, const LayerWeights& l, const float* x, int n, float*& q, float*& k, float*& v) {
  const FusedViews& f = w_.fused(il);
  if (n != 1 || !f.qkv.data) return ForwardOps::qkv(il, l, x, n, q, k, v);
  if (tune_.skip & CudaTuning::kSkipQkv) return;
  check(mem_.mm->matmul(f.qkv, x, 1, mem_.qkv1, f.qkv_bias, false, stream_), "matmul");
  q = mem_.qkv1;
  k = q + l.wq.rows;
  v = k + l.wk.rows;
}
void CudaOps::gate_up(int il, const LayerWeights& l, const float* x, int n, float*& gate, float*& up) {
  const FusedViews& f = w_.fused(il);
  if (n != 1 || !f.gate_up.data) return ForwardOps::gate_up(il, l, x, n, gate, up);
  if (tune_.skip & CudaTuning::kSkipGateUp) return;
  check(mem_.mm->matmul(f.gate_up, x, 1, mem_.gu1, nullptr, false, stream_), "matmul");
  gate = mem_.gu1;
  up = mem_.gu1 + l.w_gate.rows;
}
void CudaOps::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (tune_.skip & CudaTuning::kSkipSilu) return;
  check(cuda::silu_mul(gate, up, n, out, stream_), "silu_mul");
}
void CudaOps::rope_kv_write(int il, float* q, int n_heads, float* k, const float* v, int n_kv_heads, int n,
                            int head_dim, const int32_t* pos, const int32_t* seq, bool interleaved) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  if (!(tune_.fuse & 1))
    return ForwardOps::rope_kv_write(il, q, n_heads, k, v, n_kv_heads, n, head_dim, pos, seq, interleaved);
  check(cuda::rope_kv_write(q, n_heads, k, v, mem_.kv[il], n, pos, seq, w_.layer_inv_freq(il), interleaved,
                            stream_, w_.rope_mscale()),
        "rope_kv_write");
}
void CudaOps::moe_router(int il, const LayerWeights& l, const float* xn, int n, float* logits) {
  // The matmul is f32 up to kLowbitGemvMaxRows rows (the gemv, and the low-bit gemv), and fast there.
  const ExpertWeights& r = w_.moe(il).router;
  if (!r.data || n <= kLowbitGemvMaxRows) return ForwardOps::moe_router(il, l, xn, n, logits);
  check(cuda::moe_router(r, xn, n, logits, stream_), "moe_router");
}
void CudaOps::moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) {
  check(cuda::moe_route(logits, n, n_expert, k, norm, ids, w, stream_, &mem_.moe), "moe_route");
}
void CudaOps::moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids,
                                     float* w) {
  check(cuda::moe_route_topk_softmax(logits, n, n_expert, k, ids, w, stream_, &mem_.moe),
        "moe_route_topk_softmax");
}
void CudaOps::moe_ffn(int il, const LayerWeights& /*l*/, const float* xn, int n, const int32_t* ids,
                      const float* w, int k, float* x) {
  const MoeLayerWeights& e = w_.moe(il);
  // forward() routes just before (moe_route): a one-row step's tiles are made.
  check(cuda::moe_ffn(e.gate, e.up, e.down, xn, n, ids, w, k, x, mem_.moe, stream_, n == 1, e.swiglu_limit),
        "moe_ffn");
}
void CudaOps::sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                               float* x) {
  check(cuda::sigmoid_gate_add(y, gate_w, xn, n, dim, x, stream_), "sigmoid_gate_add");
}

bool CudaOps::fused(cudaError_t e, const char* what) {
  if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {  // nothing launched
    cudaGetLastError();
    return false;
  }
  check(e, what);
  return true;
}
bool CudaOps::norm_qkv(int il, const LayerWeights& l, const float* x, int n, float eps, float*& q, float*& k,
                       float*& v) {
  const FusedViews& f = w_.fused(il);
  if (!(tune_.fuse & 4) || tune_.skip || n != 1 || !f.qkv.data) return false;
  if (!fused(gemv_rmsnorm(f.qkv, x, nullptr, l.attn_norm, eps, mem_.qkv1, f.qkv_bias, false, stream_),
             "gemv_rmsnorm"))
    return false;
  q = mem_.qkv1;
  k = q + l.wq.rows;
  v = k + l.wk.rows;
  return true;
}
bool CudaOps::norm_gate_up(int il, const LayerWeights& l, const float* x, int n, float eps, float*& gate,
                           float*& up) {
  const FusedViews& f = w_.fused(il);
  if (!(tune_.fuse & 4) || tune_.skip || n != 1 || !f.gate_up.data) return false;
  if (!fused(gemv_rmsnorm(f.gate_up, x, nullptr, l.ffn_norm, eps, mem_.gu1, nullptr, false, stream_),
             "gemv_rmsnorm"))
    return false;
  gate = mem_.gu1;
  up = mem_.gu1 + l.w_gate.rows;
  return true;
}
bool CudaOps::norm_matmul1(const WeightView& w, const float* norm_w, const float* x, const int32_t* row,
                           float eps, float* y) {
  if (!(tune_.fuse & 16) || tune_.skip) return false;
  return fused(gemv_rmsnorm(w, x, row, norm_w, eps, y, nullptr, false, stream_), "gemv_rmsnorm");
}
bool CudaOps::silu_matmul(const WeightView& w, const float* gate, const float* up, int n, float* y,
                          bool accumulate) {
  if (!(tune_.fuse & 8) || tune_.skip || n != 1) return false;
  return fused(gemv_swiglu(w, gate, up, y, accumulate, stream_), "gemv_swiglu");
}
void CudaOps::gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) {
  check(cuda::gather_rows(x, rows, n_rows, dim, out, stream_), "gather_rows");
}

}  // namespace ultra::cuda
