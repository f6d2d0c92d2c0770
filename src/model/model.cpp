#include "model/model.h"

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

const float* ModelData::add_vector(GgmlType type, const void* data, int64_t n, uint64_t n_bytes) {
  std::vector<float> v(n);
  if (!to_f32(type, data, n, v.data())) return nullptr;
  weight_bytes += n_bytes;
  return owned.emplace_back(std::move(v)).data();
}

std::string shape_string(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace ultra
