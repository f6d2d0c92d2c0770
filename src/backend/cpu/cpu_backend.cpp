#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/error.h"

namespace ultra {

namespace {

ContextParams resolve(const Model& m, ContextParams p) {
  if (p.n_ctx <= 0) p.n_ctx = std::min(m.hp.train_ctx, 4096);
  if (p.n_slots <= 0) fail("context: n_slots must be >= 1 (got {})", p.n_slots);
  if (p.n_batch <= 0) fail("context: n_batch must be >= 1 (got {})", p.n_batch);
  if (p.n_threads <= 0) p.n_threads = std::max(1u, std::thread::hardware_concurrency());
  if (p.n_outputs <= 0) p.n_outputs = p.n_slots;
  if (p.n_slots > p.n_batch) fail("context: n_slots {} exceeds n_batch {}", p.n_slots, p.n_batch);
  p.n_outputs = std::min(p.n_outputs, p.n_batch);  // a step outputs at most one row per token
  if (p.n_ctx > (1 << 24)) fail("context: n_ctx {} is too large", p.n_ctx);
  if (p.n_batch > (1 << 16)) fail("context: n_batch {} is too large", p.n_batch);
  if (p.n_threads > 1024) fail("context: {} threads is too many", p.n_threads);
  return p;
}

KvCacheParams kv_params(const Model& m, const ContextParams& p) {
  KvCacheParams k;
  k.n_layers = m.hp.n_layers;
  k.n_slots = p.n_slots;
  k.n_kv_heads = m.hp.n_kv_heads;
  k.max_ctx = p.n_ctx;
  k.head_dim = m.hp.head_dim;
  k.type = p.kv_type;
  return k;
}

size_t mm_scratch(const Model& m, const ContextParams& p) {
  size_t s = cpu::matmul_scratch_floats(m.output, p.n_outputs, p.n_threads);
  for (const auto& l : m.layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      s = std::max(s, cpu::matmul_scratch_floats(*w, p.n_batch, p.n_threads));
  return s;
}

}  // namespace

CpuBackend::CpuBackend(const Model& model, const ContextParams& params)
    : m_(model), p_(resolve(model, params)), pool_(p_.n_threads), kv_(kv_params(model, p_)) {
  const HParams& hp = m_.hp;
  const size_t nb = p_.n_batch, q_dim = (size_t)hp.n_heads * hp.head_dim,
               kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  token_ = Buffer<int32_t>(nb);
  pos_ = Buffer<int32_t>(nb);
  slot_ = Buffer<int32_t>(nb);
  out_row_ = Buffer<int32_t>(p_.n_outputs);
  x_ = Buffer<float>(nb * hp.dim);
  xb_ = Buffer<float>(nb * std::max<size_t>(hp.dim, q_dim));
  q_ = Buffer<float>(nb * q_dim);
  k_ = Buffer<float>(nb * kv_dim);
  v_ = Buffer<float>(nb * kv_dim);
  att_ = Buffer<float>(nb * q_dim);
  hb_ = Buffer<float>(nb * hp.ffn_dim);
  hb2_ = Buffer<float>(nb * hp.ffn_dim);
  out_x_ = Buffer<float>((size_t)p_.n_outputs * hp.dim);
  logits_ = Buffer<float>((size_t)p_.n_outputs * hp.n_vocab);
  mm_scratch_ = Buffer<float>(mm_scratch(m_, p_));
  attn_scratch_ = Buffer<float>(cpu::attention_scratch_floats(p_.n_ctx, p_.n_threads));
}

StepInputs CpuBackend::inputs() {
  return {token_.data(), pos_.data(), slot_.data(), out_row_.data()};
}

Footprint CpuBackend::footprint() const {
  Footprint f;
  f.weights = m_.weight_bytes;
  f.kv = kv_.bytes();
  for (size_t b : {token_.bytes(), pos_.bytes(), slot_.bytes(), out_row_.bytes(), x_.bytes(), xb_.bytes(),
                   q_.bytes(), k_.bytes(), v_.bytes(), att_.bytes(), hb_.bytes(), hb2_.bytes(),
                   out_x_.bytes(), logits_.bytes(), mm_scratch_.bytes(), attn_scratch_.bytes()})
    f.scratch += b;
  return f;
}

// One forward step over n tokens (llama2.c's forward(), batched):
//   x = embed(tokens)
//   per layer: x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//              x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//   logits[r] = Wout · norm(x[out_row[r]])
void CpuBackend::step(int n, int n_out) {
  const HParams& hp = m_.hp;
  const int dim = hp.dim;
  const float scale = 1.0f / std::sqrt((float)hp.head_dim);
  float* x = x_.data();
  float* xb = xb_.data();
  float* mm = mm_scratch_.data();

  for (int t = 0; t < n; ++t) cpu::dequant_row(m_.tok_embd, token_[t], x + (size_t)t * dim);

  for (int il = 0; il < hp.n_layers; ++il) {
    const LayerWeights& l = m_.layers[il];
    const KvLayerView kv = kv_.layer(il);

    cpu::rmsnorm(x, l.attn_norm, n, dim, hp.rms_eps, xb);
    cpu::matmul(pool_, l.wq, xb, n, q_.data(), l.bq, mm);
    cpu::matmul(pool_, l.wk, xb, n, k_.data(), l.bk, mm);
    cpu::matmul(pool_, l.wv, xb, n, v_.data(), l.bv, mm);
    cpu::rope(q_.data(), n, hp.n_heads, hp.head_dim, pos_.data(), m_.rope_inv_freq.data(),
              hp.rope_interleaved);
    cpu::rope(k_.data(), n, hp.n_kv_heads, hp.head_dim, pos_.data(), m_.rope_inv_freq.data(),
              hp.rope_interleaved);
    cpu::kv_write(kv, k_.data(), v_.data(), n, pos_.data(), slot_.data());
    cpu::attention(pool_, kv, q_.data(), n, hp.n_heads, pos_.data(), slot_.data(), scale, att_.data(),
                   attn_scratch_.data());
    cpu::matmul(pool_, l.wo, att_.data(), n, xb, nullptr, mm);
    for (size_t i = 0; i < (size_t)n * dim; ++i) x[i] += xb[i];

    cpu::rmsnorm(x, l.ffn_norm, n, dim, hp.rms_eps, xb);
    cpu::matmul(pool_, l.w_gate, xb, n, hb_.data(), nullptr, mm);
    cpu::matmul(pool_, l.w_up, xb, n, hb2_.data(), nullptr, mm);
    cpu::silu_mul(hb_.data(), hb2_.data(), (int64_t)n * hp.ffn_dim, hb2_.data());
    cpu::matmul(pool_, l.w_down, hb2_.data(), n, xb, nullptr, mm);
    for (size_t i = 0; i < (size_t)n * dim; ++i) x[i] += xb[i];
  }

  for (int r = 0; r < n_out; ++r) std::copy_n(x + (size_t)out_row_[r] * dim, dim, xb + (size_t)r * dim);
  cpu::rmsnorm(xb, m_.output_norm, n_out, dim, hp.rms_eps, out_x_.data());
  cpu::matmul(pool_, m_.output, out_x_.data(), n_out, logits_.data(), nullptr, mm);
}

}  // namespace ultra
