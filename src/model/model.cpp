#include "model/model.h"

#include "model/loader_util.h"

namespace ultra {

WeightView ModelData::add_matrix(GgmlType type, const void* data, int64_t rows, int64_t cols,
                                 uint64_t n_bytes) {
  WeightView w;
  w.type = type;
  w.data = data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = n_bytes / rows;
  weight_bytes += n_bytes;
  return w;
}

const float* ModelData::add_vector(GgmlType type, const void* data, int64_t n, uint64_t n_bytes,
                                   float shift) {
  std::vector<float> v(n);
  if (!to_f32(type, data, n, v.data())) return nullptr;
  if (shift != 0)
    for (float& x : v) x += shift;
  weight_bytes += n_bytes;
  return owned.emplace_back(std::move(v)).data();
}

const std::vector<float>& ModelData::layer_rope_inv_freq(int il, int n_ctx) const {
  if (!rope_inv_freq_swa.empty() && hp.layer_swa(il)) return rope_inv_freq_swa;
  if (!rope_inv_freq_long.empty() && n_ctx > hp.rope_scaling.original_max_position_embeddings)
    return rope_inv_freq_long;
  return rope_inv_freq;
}

void set_rope_tables(ModelData& m) {
  m.rope_inv_freq = m.hp.rope_inv_freq();
  m.rope_inv_freq_swa.clear();
  m.rope_inv_freq_long.clear();
  if (m.hp.rope_theta_swa > 0 && !m.hp.swa_layers.empty()) m.rope_inv_freq_swa = m.hp.rope_inv_freq(true);
  if (m.hp.rope_scaling.type == "longrope") m.rope_inv_freq_long = m.hp.rope_inv_freq(false, true);
}

std::string shape_string(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace ultra
