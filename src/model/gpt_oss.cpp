#include "model/gpt_oss.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/quants.h"

namespace ultra {

namespace {

struct ExpertReader {
  ModelData& m;
  const safetensors::Checkpoint& ck;
  std::unordered_set<std::string>& used;
  const std::string& dir;
  int n_expert;

  const safetensors::Tensor& get(const std::string& name, const std::vector<uint64_t>& shape) {
    const safetensors::Tensor* t = ck.find(name);
    if (!t) fail("{}: missing tensor '{}'", dir, name);
    if (t->shape != shape)
      fail("{}: tensor '{}' has shape {}, expected {}", t->file, name, shape_string(t->shape),
           shape_string(shape));
    used.insert(name);
    return *t;
  }

  // A dense expert tensor: F32, F16 or BF16.
  const safetensors::Tensor& dense(const std::string& name, const std::vector<uint64_t>& shape) {
    const safetensors::Tensor& t = get(name, shape);
    if (!t.type_supported || (t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::BF16))
      fail("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16 (or MXFP4 blocks and scales)", t.file,
           name, t.dtype);
    return t;
  }

  // n_expert matrices [rows, cols] of type t in one owned buffer, filled by fill(dst, element size).
  template <class Fill>
  const WeightView* matrices(GgmlType t, int64_t rows, int64_t cols, Fill&& fill) {
    const size_t rb = row_bytes(*type_traits(t), (uint64_t)cols), per = rb * (size_t)rows;
    std::vector<uint8_t>& buf = m.owned_bytes.emplace_back(per * n_expert);
    fill(buf.data());
    std::vector<WeightView>& v = m.owned_views.emplace_back();
    for (int e = 0; e < n_expert; ++e) v.push_back(m.add_matrix(t, buf.data() + per * e, rows, cols, per));
    return v.data();
  }

  // [n_expert, n] as f32, the columns c0, c0 + step, ... of a [n_expert, n * step] tensor.
  const float* bias(const safetensors::Tensor& t, int64_t n, int step, int c0) {
    const int64_t total = (int64_t)n_expert * n * step;
    std::vector<float> all(total);
    if (!to_f32(t.type, t.data, total, all.data()))
      fail("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", t.file, t.name, t.dtype);
    std::vector<float> v((size_t)n_expert * n);
    for (int64_t i = 0; i < (int64_t)v.size(); ++i) v[i] = all[(size_t)(i * step + c0)];
    m.weight_bytes += (uint64_t)v.size() * 4;
    return m.owned.emplace_back(std::move(v)).data();
  }
};

// Element (e, i, j) of a [n_expert, I, J] tensor of 2- or 4-byte elements, copied to dst.
inline void copy_elem(const uint8_t* src, size_t es, int64_t idx, uint8_t* dst) {
  std::memcpy(dst, src + (size_t)idx * es, es);
}

// Rows r0, r0 + step, ... (n of them, over cols inputs) of one expert's MXFP4 blocks [rows, cols/32, 16] and
// scales [rows, cols/32] -> n rows of ggml block_mxfp4.
void repack_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t n, int64_t cols, int64_t r0, int step,
                  BlockMXFP4* out) {
  const int64_t g = cols / 32;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t src = r0 + r * step;
    for (int64_t b = 0; b < g; ++b) {
      const uint8_t* in = blocks + ((size_t)src * g + b) * 16;
      uint8_t v[32];
      for (int j = 0; j < 16; ++j) {
        v[2 * j] = in[j] & 0xF;
        v[2 * j + 1] = in[j] >> 4;
      }
      BlockMXFP4& o = out[r * g + b];
      o.e = scales[src * g + b];
      for (int j = 0; j < 16; ++j) o.qs[j] = (uint8_t)(v[j] | (v[j + 16] << 4));
    }
  }
}

}  // namespace

void load_gpt_oss_hf_experts(ModelData& m, const safetensors::Checkpoint& ck,
                             std::unordered_set<std::string>& used, const std::string& dir) {
  const HParams& hp = m.hp;
  const int64_t E = hp.n_expert, D = hp.dim, F = hp.expert_ffn_dim;
  const uint64_t e = (uint64_t)E, d = (uint64_t)D, f = (uint64_t)F;
  ExpertReader R{m, ck, used, dir, hp.n_expert};
  for (int il = 0; il < hp.n_layers; ++il) {
    LayerWeights& l = m.layers[il];
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", il);
    if (ck.find(p + "gate_up_proj_blocks")) {
      if (D % 32 != 0 || F % 32 != 0)
        fail("{}: MXFP4 experts need hidden_size ({}) and intermediate_size ({}) multiples of 32", dir, D, F);
      auto u8 = [&](const std::string& name, const std::vector<uint64_t>& shape) -> const uint8_t* {
        const safetensors::Tensor& t = R.get(name, shape);
        if (t.dtype != "U8") fail("{}: tensor '{}' has dtype {}, expected U8 (MXFP4)", t.file, name, t.dtype);
        return t.data;
      };
      const uint8_t* gu_b = u8(p + "gate_up_proj_blocks", {e, 2 * f, d / 32, 16});
      const uint8_t* gu_s = u8(p + "gate_up_proj_scales", {e, 2 * f, d / 32});
      const uint8_t* dn_b = u8(p + "down_proj_blocks", {e, d, f / 32, 16});
      const uint8_t* dn_s = u8(p + "down_proj_scales", {e, d, f / 32});
      const size_t gu_rows = (size_t)(2 * F * (D / 32)), dn_rows = (size_t)(D * (F / 32));
      for (int part = 0; part < 2; ++part) {  // gate: the even rows, up: the odd ones
        const WeightView* v = R.matrices(GgmlType::MXFP4, F, D, [&](uint8_t* dst) {
          for (int64_t x = 0; x < E; ++x)
            repack_mxfp4(gu_b + x * gu_rows * 16, gu_s + x * gu_rows, F, D, part, 2,
                         reinterpret_cast<BlockMXFP4*>(dst) + x * F * (D / 32));
        });
        (part == 0 ? l.gate_exps : l.up_exps) = v;
      }
      l.down_exps = R.matrices(GgmlType::MXFP4, D, F, [&](uint8_t* dst) {
        for (int64_t x = 0; x < E; ++x)
          repack_mxfp4(dn_b + x * dn_rows * 16, dn_s + x * dn_rows, D, F, 0, 1,
                       reinterpret_cast<BlockMXFP4*>(dst) + x * D * (F / 32));
      });
    } else {
      const safetensors::Tensor& gu = R.dense(p + "gate_up_proj", {e, d, 2 * f});
      const safetensors::Tensor& dn = R.dense(p + "down_proj", {e, f, d});
      const size_t es = gu.type == GgmlType::F32 ? 4 : 2;
      for (int part = 0; part < 2; ++part) {  // gate[x][r][c] = W[x][c][2r + part]
        const WeightView* v = R.matrices(gu.type, F, D, [&](uint8_t* dst) {
          for (int64_t x = 0; x < E; ++x)
            for (int64_t r = 0; r < F; ++r)
              for (int64_t c = 0; c < D; ++c)
                copy_elem(gu.data, es, (x * D + c) * 2 * F + 2 * r + part, dst + ((x * F + r) * D + c) * es);
        });
        (part == 0 ? l.gate_exps : l.up_exps) = v;
      }
      const size_t ds = dn.type == GgmlType::F32 ? 4 : 2;
      l.down_exps = R.matrices(dn.type, D, F, [&](uint8_t* dst) {  // down[x][r][c] = W[x][c][r]
        for (int64_t x = 0; x < E; ++x)
          for (int64_t r = 0; r < D; ++r)
            for (int64_t c = 0; c < F; ++c)
              copy_elem(dn.data, ds, (x * F + c) * D + r, dst + ((x * D + r) * F + c) * ds);
      });
    }
    const safetensors::Tensor& gub = R.dense(p + "gate_up_proj_bias", {e, 2 * f});
    l.gate_exps_b = R.bias(gub, F, 2, 0);
    l.up_exps_b = R.bias(gub, F, 2, 1);
    l.down_exps_b = R.bias(R.dense(p + "down_proj_bias", {e, d}), D, 1, 0);
  }
}

}  // namespace ultra
