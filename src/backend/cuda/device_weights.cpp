#include "backend/cuda/device_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemv_lowbit.h"
#include "core/error.h"
#include "core/quants.h"

namespace ultra::cuda {

namespace {

// Elements of the BF16 copy a prefill matmul makes of a low-bit matrix (0 for other types).
int64_t lowbit_bf16_elems(const WeightView& w) {
  return is_lowbit(w.type) ? w.rows * lowbit_bf16_ld(w.cols) : 0;
}

}  // namespace

void expand_mxfp4_rows(const WeightView& w, int64_t r0, int64_t r1, uint16_t* out) {
  const int64_t nb = w.cols / kQK4;
  float v[kQK4];
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks =
        reinterpret_cast<const BlockMXFP4*>(static_cast<const uint8_t*>(w.data) + (size_t)r * w.row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      dequant_block(blocks[b], v);
      for (int i = 0; i < kQK4; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &v[i], 4);
        *out++ = (uint16_t)(bits >> 16);  // the low half is zero (device_weights.h)
      }
    }
  }
}

int64_t DeviceWeights::max_lowbit_bf16_elems(const ModelData& m) {
  int64_t max_lowbit = 0;
  for (const WeightView* w : {&m.output}) max_lowbit = std::max(max_lowbit, lowbit_bf16_elems(*w));
  for (const LayerWeights& l : m.layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.ffn_gate_inp,
                                &l.w_gate_shexp, &l.w_up_shexp, &l.w_down_shexp})
      max_lowbit = std::max(max_lowbit, lowbit_bf16_elems(*w));
  return max_lowbit;
}

DeviceWeights::DeviceWeights(const ModelData& m, int n_ctx) : m_(m), n_ctx_(n_ctx) {
  const HParams& hp = m_.hp;
  std::unordered_map<const void*, bool> seen;
  std::vector<Part> scale_parts;                // the F8_E4M3 / TERNARY scale arrays, each its own block
  std::vector<std::vector<Part>> scale_groups;  // those of a fused F8_E4M3 / TERNARY matrix: one block
  // Moves the scale parts of the fused matrices ws (the last ones given to mat) into one block, in row order,
  // a scale per tensor repeated once per row: the fused view's scales, one per row.
  auto group_scales = [&](std::initializer_list<const WeightView*> ws) {
    if (!(*ws.begin())->scale || scale_parts.size() < ws.size()) return;
    std::vector<Part> g(scale_parts.end() - (long)ws.size(), scale_parts.end());
    scale_parts.resize(scale_parts.size() - ws.size());
    size_t i = 0;
    for (const WeightView* w : ws) {
      if (w->scale_row_stride == 0) g[i].repeat = w->rows, g[i].bytes *= (size_t)w->rows;
      ++i;
    }
    scale_groups.push_back(g);
  };
  // expert: one of a mixture-of-experts layer's experts (MXFP4 keeps its 4 bits there: the expert kernels
  // decode it; elsewhere it is expanded to BF16, 16 bits a weight, for the dense matmuls).
  auto mat = [&](const WeightView& w, bool expert = false) -> Part {
    if (w.type == GgmlType::MXFP4) {
      if (w.cols % kQK4 != 0)
        fail("CUDA backend: an MXFP4 matrix of {} columns (not a multiple of 32)", w.cols);
      if (expert) return {w.data, (size_t)w.rows * moe_mxfp4_row_bytes(w.cols), nullptr, 1, &w, true};
      return {w.data, (size_t)w.rows * (size_t)w.cols * 2, nullptr, 1, &w};
    }
    if (is_lowbit(w.type)) {
      const size_t rb = lowbit_row_bytes(w.type, w.cols);
      if (!rb)
        fail("CUDA backend: a {} matrix of {} columns has no device layout", type_name(w.type), w.cols);
      if (const int64_t ns = lowbit_scale_count(w); ns > 0) {
        if (!w.scale) fail("CUDA backend: a {} matrix without scales", type_name(w.type));
        scale_parts.push_back({w.scale, (size_t)ns * sizeof(float)});
      }
      return {w.data, rb * (size_t)w.rows, &w};
    }
    if (w.type != GgmlType::F32 && w.type != GgmlType::F16 && w.type != GgmlType::BF16)
      fail(
          "CUDA backend: {} weights are not supported (use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
          "Q4_K, "
          "Q5_K, Q6_K, F8_E4M3 or TERNARY weights, or the CPU backend)",
          type_name(w.type));
    return {w.data, w.row_bytes * (size_t)w.rows};
  };
  auto add = [&](std::vector<Part> parts) {
    std::vector<Part> keep;
    for (const Part& p : parts)
      if (!p.src || seen.emplace(p.src, true).second) keep.push_back(p);
    if (!keep.empty()) blocks_.push_back(keep);
  };
  // Matrices that can share one view: same type, columns and row size, 16-byte rows. Of the low-bit types
  // Q8_0 and the GGUF block types (gemv_kquant.h), whose scales are inside their device rows, and F8_E4M3 /
  // TERNARY with one scale per row or tensor, whose scale arrays are then placed back to back as one per row
  // (one block, below): one launch for [Wq; Wk; Wv] and [W_gate; W_up].
  auto fusable = [&](std::initializer_list<const WeightView*> ws) {
    const WeightView& a = **ws.begin();
    if (is_lowbit(a.type)) {
      for (const WeightView* w : ws)
        if (w->cols != a.cols || w->type != a.type ||
            (a.type != GgmlType::Q8_0 && !is_kquant(a.type) && !lowbit_scale_per_row_or_tensor(*w)))
          return false;
      return true;
    }
    for (const WeightView* w : ws)
      if (w->type != a.type || w->cols != a.cols || w->row_bytes != a.row_bytes || w->row_bytes % 16)
        return false;
    return true;
  };
  add({mat(m_.tok_embd)});
  add({mat(m_.output)});
  const size_t q_dim = (size_t)hp.n_heads * hp.head_dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  for (const LayerWeights& l : m_.layers) {
    fuse_qkv_.push_back(fusable({&l.wq, &l.wk, &l.wv}));
    fuse_gu_.push_back(fusable({&l.w_gate, &l.w_up}));
    if (fuse_qkv_.back()) {
      add({mat(l.wq), mat(l.wk), mat(l.wv)});
      if (lowbit_scale_count(l.wq) > 0) group_scales({&l.wq, &l.wk, &l.wv});
    } else {
      add({mat(l.wq)});
      add({mat(l.wk)});
      add({mat(l.wv)});
    }
    add({mat(l.wo)});
    if (fuse_gu_.back()) {
      add({mat(l.w_gate), mat(l.w_up)});
      if (lowbit_scale_count(l.w_gate) > 0) group_scales({&l.w_gate, &l.w_up});
    } else {
      add({mat(l.w_gate)});
      add({mat(l.w_up)});
    }
    add({mat(l.w_down)});
    if (hp.moe()) {  // the router, each kind's experts back to back (one block: moe.h), the shared expert
      add({mat(l.ffn_gate_inp)});
      for (const WeightView* ex : {l.gate_exps, l.up_exps, l.down_exps}) {
        std::vector<Part> parts;
        for (int e = 0; e < hp.n_expert; ++e) {
          if (ex[e].type != GgmlType::F32 && ex[e].type != GgmlType::F16 && ex[e].type != GgmlType::BF16 &&
              ex[e].type != GgmlType::Q8_0 && ex[e].type != GgmlType::MXFP4)
            fail(
                "CUDA backend: {} expert weights are not supported (use F32, F16, BF16, Q8_0 or MXFP4 "
                "experts, or the CPU backend)",
                type_name(ex[e].type));
          parts.push_back(mat(ex[e], true));
        }
        add(parts);
      }
      if (l.ffn_gate_inp_b) add({{l.ffn_gate_inp_b, (size_t)hp.n_expert * sizeof(float)}});
      const size_t ne = (size_t)hp.n_expert, ef = (size_t)hp.expert_ffn_dim;
      if (l.gate_exps_b) add({{l.gate_exps_b, ne * ef * sizeof(float)}});
      if (l.up_exps_b) add({{l.up_exps_b, ne * ef * sizeof(float)}});
      if (l.down_exps_b) add({{l.down_exps_b, ne * (size_t)hp.dim * sizeof(float)}});
      if (hp.shexp_ffn_dim) {
        add({mat(l.w_gate_shexp)});
        add({mat(l.w_up_shexp)});
        add({mat(l.w_down_shexp)});
        add({{l.ffn_gate_inp_shexp, hp.dim * sizeof(float)}});
      }
    }
    add({{l.attn_norm, hp.dim * sizeof(float)}});
    add({{l.ffn_norm, hp.dim * sizeof(float)}});
    if (l.attn_post_norm) add({{l.attn_post_norm, hp.dim * sizeof(float)}});
    if (l.ffn_post_norm) add({{l.ffn_post_norm, hp.dim * sizeof(float)}});
    if (l.bq || l.bk || l.bv)
      add({{l.bq, q_dim * sizeof(float)}, {l.bk, kv_dim * sizeof(float)}, {l.bv, kv_dim * sizeof(float)}});
    if (l.q_norm) add({{l.q_norm, hp.head_dim * sizeof(float)}, {l.k_norm, hp.head_dim * sizeof(float)}});
    if (l.bo) add({{l.bo, hp.dim * sizeof(float)}});
    if (l.attn_sinks) add({{l.attn_sinks, hp.n_heads * sizeof(float)}});
  }
  add({{m_.output_norm, hp.dim * sizeof(float)}});
  add({{m_.rope_inv_freq.data(), hp.head_dim / 2 * sizeof(float)}});
  for (const std::vector<float>* t : {&m_.rope_inv_freq_swa, &m_.rope_inv_freq_long})
    if (!t->empty()) add({{t->data(), hp.head_dim / 2 * sizeof(float)}});
  for (const Part& p : scale_parts) add({p});
  for (const std::vector<Part>& g : scale_groups) add(g);

  // Where each part goes: blocks back to back, each starting 256-byte aligned.
  for (const auto& b : blocks_) {
    for (const Part& p : b) {
      if (p.src) offset_[p.src] = total_;
      total_ += p.bytes;
    }
    total_ = DeviceAllocator::aligned(total_);
  }
}

void DeviceWeights::upload(void* base_ptr, const std::function<void(size_t, size_t)>& progress) {
  uint8_t* base = static_cast<uint8_t*>(base_ptr);
  size_t at = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double last_report_ms = -1;  // none yet
  std::vector<uint8_t> stage;  // low-bit rows in the device layout, up to 64 MiB at a time
  // rows [0, rows) of rb bytes each, made on the host by fill(r0, r1, stage) 64 MiB at a time, to base + at
  auto upload_rows = [&](int64_t rows, size_t rb, const auto& fill) {
    const int64_t step = std::max<int64_t>(1, (int64_t)((size_t(64) << 20) / rb));
    stage.resize((size_t)std::min<int64_t>(step, rows) * rb);
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t r1 = std::min(rows, r0 + step);
      fill(r0, r1, stage.data());
      check(cudaMemcpy(base + at + (size_t)r0 * rb, stage.data(), (size_t)(r1 - r0) * rb,
                       cudaMemcpyHostToDevice),
            "weight upload");
    }
  };
  for (const auto& b : blocks_) {
    for (const Part& p : b) {
      if (p.mxfp4 && p.mxfp4_native) {  // the expert kernels' MXFP4 layout (moe.h)
        const WeightView& w = *p.mxfp4;
        upload_rows(w.rows, moe_mxfp4_row_bytes(w.cols), [&](int64_t r0, int64_t r1, uint8_t* out) {
          if (!moe_pack_mxfp4_rows(w, r0, r1, out))
            fail("CUDA backend: cannot repack an MXFP4 matrix [{}, {}]", w.rows, w.cols);
        });
      } else if (p.mxfp4) {  // BF16
        const WeightView& w = *p.mxfp4;
        upload_rows(w.rows, (size_t)w.cols * 2, [&](int64_t r0, int64_t r1, uint8_t* out) {
          expand_mxfp4_rows(w, r0, r1, reinterpret_cast<uint16_t*>(out));
        });
      } else if (p.lowbit) {
        const WeightView& w = *p.lowbit;
        upload_rows(w.rows, lowbit_row_bytes(w.type, w.cols), [&](int64_t r0, int64_t r1, uint8_t* out) {
          if (!lowbit_pack_rows(w, r0, r1, out))
            fail("CUDA backend: cannot repack a {} matrix [{}, {}]", type_name(w.type), w.rows, w.cols);
        });
      } else if (p.src && p.repeat > 1) {
        const size_t one = p.bytes / (size_t)p.repeat;
        stage.resize(p.bytes);
        for (int64_t i = 0; i < p.repeat; ++i) std::memcpy(stage.data() + (size_t)i * one, p.src, one);
        check(cudaMemcpy(base + at, stage.data(), p.bytes, cudaMemcpyHostToDevice), "weight upload");
      } else if (p.src) {
        check(cudaMemcpy(base + at, p.src, p.bytes, cudaMemcpyHostToDevice), "weight upload");
      } else {
        check(cudaMemset(base + at, 0, p.bytes), "weight upload");
      }
      at += p.bytes;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (progress && ms > 1000 && ms - last_report_ms >= 100) {
        progress(std::min(at, total_), total_);
        last_report_ms = ms;
      }
    }
    at = DeviceAllocator::aligned(at);
  }
  if (progress && last_report_ms >= 0) progress(total_, total_);
  make_views(base);
}

void DeviceWeights::make_views(const uint8_t* base) {
  const HParams& hp = m_.hp;
  const size_t q_dim = (size_t)hp.n_heads * hp.head_dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  auto dev = [&](const void* host) { return base + offset_.at(host); };
  auto dev_mat = [&](const WeightView& w) {
    WeightView d = w;
    if (!w.data) return d;  // an empty matrix (a mixture-of-experts layer's dense FFN)
    d.data = dev(w.data);
    if (w.type == GgmlType::MXFP4) {  // expanded to BF16 (above)
      d.type = GgmlType::BF16;
      d.row_bytes = (size_t)w.cols * 2;
      d.scale = nullptr;
    } else if (is_lowbit(w.type)) {  // device layout; the scales' device copy
      d.row_bytes = lowbit_row_bytes(w.type, w.cols);
      d.scale = w.scale ? reinterpret_cast<const float*>(dev(w.scale)) : nullptr;
    }
    return d;
  };
  auto dev_vec = [&](const float* p) { return p ? reinterpret_cast<const float*>(dev(p)) : nullptr; };
  w_.tok_embd = dev_mat(m_.tok_embd);
  w_.output = dev_mat(m_.output);
  w_.output_norm = dev_vec(m_.output_norm);
  for (int il = 0; il < hp.n_layers; ++il)  // the sliding-window layers' own, longrope's long factors, ...
    layer_inv_freq_.push_back(dev_vec(m_.layer_rope_inv_freq(il, n_ctx_).data()));
  // longrope's and YaRN's attention factor on cos and sin, as the CPU backend (cpu_backend.cpp) applies it
  const std::string& rope_type = hp.rope_scaling.type;
  rope_mscale_ = rope_type == "longrope" || rope_type == "yarn" ? hp.rope_scaling.attention_factor : 1.0f;
  exp_views_.reserve(3 * m_.layers.size());
  for (size_t il = 0; il < m_.layers.size(); ++il) {
    const LayerWeights& l = m_.layers[il];
    LayerWeights d = l;
    d.wq = dev_mat(l.wq);
    d.wk = dev_mat(l.wk);
    d.wv = dev_mat(l.wv);
    d.wo = dev_mat(l.wo);
    d.w_gate = dev_mat(l.w_gate);
    d.w_up = dev_mat(l.w_up);
    d.w_down = dev_mat(l.w_down);
    d.attn_norm = dev_vec(l.attn_norm);
    d.ffn_norm = dev_vec(l.ffn_norm);
    d.attn_post_norm = dev_vec(l.attn_post_norm);
    d.ffn_post_norm = dev_vec(l.ffn_post_norm);
    d.bq = dev_vec(l.bq);
    d.bk = dev_vec(l.bk);
    d.bv = dev_vec(l.bv);
    d.q_norm = dev_vec(l.q_norm);
    d.k_norm = dev_vec(l.k_norm);
    d.bo = dev_vec(l.bo);
    d.attn_sinks = dev_vec(l.attn_sinks);
    if (hp.moe()) {
      d.ffn_gate_inp = dev_mat(l.ffn_gate_inp);
      d.w_gate_shexp = dev_mat(l.w_gate_shexp);
      d.w_up_shexp = dev_mat(l.w_up_shexp);
      d.w_down_shexp = dev_mat(l.w_down_shexp);
      d.ffn_gate_inp_shexp = dev_vec(l.ffn_gate_inp_shexp);
      d.ffn_gate_inp_b = dev_vec(l.ffn_gate_inp_b);
      d.gate_exps_b = dev_vec(l.gate_exps_b);
      d.up_exps_b = dev_vec(l.up_exps_b);
      d.down_exps_b = dev_vec(l.down_exps_b);
      MoeLayerWeights ml;
      ExpertWeights* kinds[3] = {&ml.gate, &ml.up, &ml.down};
      const WeightView* host[3] = {l.gate_exps, l.up_exps, l.down_exps};
      const WeightView** dev_arr[3] = {&d.gate_exps, &d.up_exps, &d.down_exps};
      const float* biases[3] = {d.gate_exps_b, d.up_exps_b, d.down_exps_b};
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<WeightView>& views = exp_views_.emplace_back();
        for (int e = 0; e < hp.n_expert; ++e) {
          views.push_back(dev_mat(host[kind][e]));
          if (host[kind][e].type == GgmlType::MXFP4)  // the expert kernels' layout (above), not BF16
            views.back().type = GgmlType::MXFP4,
            views.back().row_bytes = moe_mxfp4_row_bytes(views.back().cols);
        }
        *dev_arr[kind] = views.data();
        ExpertWeights& x = *kinds[kind];
        x.type = views[0].type;
        x.data = views[0].data;
        x.rows = views[0].rows;
        x.cols = views[0].cols;
        x.row_bytes = views[0].row_bytes;
        x.expert_bytes = x.row_bytes * (size_t)x.rows;
        x.n_expert = hp.n_expert;
        x.bias = biases[kind];
        for (int e = 0; e < hp.n_expert; ++e)  // placed back to back by the block above
          if (views[e].data != static_cast<const uint8_t*>(x.data) + (size_t)e * x.expert_bytes ||
              views[e].type != x.type || views[e].rows != x.rows || views[e].cols != x.cols)
            fail("CUDA backend: layer {}'s experts are not alike (expert {})", il, e);
        if (!moe_weights_ok(x))
          fail(
              "CUDA backend: layer {}'s {} experts [{}, {}] have no CUDA kernel (columns must be a multiple "
              "of 8)",
              il, type_name(x.type), x.rows, x.cols);
      }
      ml.router.type = d.ffn_gate_inp.type;
      ml.router.data = d.ffn_gate_inp.data;
      ml.router.rows = d.ffn_gate_inp.rows;
      ml.router.cols = d.ffn_gate_inp.cols;
      ml.router.row_bytes = d.ffn_gate_inp.row_bytes;
      ml.router.expert_bytes = ml.router.row_bytes * (size_t)ml.router.rows;
      ml.router.n_expert = 1;
      ml.router.bias = d.ffn_gate_inp_b;
      ml.swiglu_limit = hp.swiglu_limit;
      if (!moe_weights_ok(ml.router)) ml.router.data = nullptr;
      moe_.push_back(ml);
    }
    w_.layers.push_back(d);
    FusedViews f;
    if (fuse_qkv_[il]) {
      f.qkv = d.wq;
      f.qkv.rows = l.wq.rows + l.wk.rows + l.wv.rows;
      if (f.qkv.scale) f.qkv.scale_row_stride = 1, f.qkv.scale_group = f.qkv.cols;  // one per row (above)
      // The bias block starts at bq when it exists, else at the zeros placed for it.
      if (l.bq || l.bk || l.bv) f.qkv_bias = l.bq ? d.bq : l.bk ? d.bk - q_dim : d.bv - q_dim - kv_dim;
    }
    if (fuse_gu_[il]) {
      f.gate_up = d.w_gate;
      f.gate_up.rows = l.w_gate.rows + l.w_up.rows;
      if (f.gate_up.scale) f.gate_up.scale_row_stride = 1, f.gate_up.scale_group = f.gate_up.cols;
    }
    fused_.push_back(f);
  }
}

}  // namespace ultra::cuda
