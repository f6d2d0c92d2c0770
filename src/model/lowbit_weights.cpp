#include "model/lowbit_weights.h"

#include "core/error.h"
#include "core/fp8.h"
#include "core/lowbit.h"
#include "core/ternary.h"
#include "model/model.h"

namespace ultra {

std::string scale_tensor_name(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale";
  return weight_name + ".scale";
}

WeightView gguf_matrix_view(const gguf::Reader& r, const gguf::TensorInfo& t, std::string* scale_name) {
  if (t.ne.size() != 2)
    fail("{}: tensor '{}' is not a matrix (shape {})", r.path(), t.name, shape_string(t.ne));
  WeightView w;
  w.type = t.type;
  w.data = t.data;
  w.cols = (int64_t)t.ne[0];
  w.rows = (int64_t)t.ne[1];
  w.row_bytes = t.n_bytes / (uint64_t)w.rows;
  if (!has_scale_tensor(t.type)) return w;
  const std::string sn = scale_tensor_name(t.name);
  const gguf::TensorInfo* s = r.find_tensor(sn);
  if (!s) fail("{}: tensor '{}' ({}) has no scale tensor '{}'", r.path(), t.name, type_name(t.type), sn);
  if (s->type != GgmlType::F32 || s->ne.size() != 1)
    fail("{}: scale tensor '{}' must be a 1-D F32 tensor (it is {} {})", r.path(), sn, type_name(s->type),
         shape_string(s->ne));
  const int64_t n = (int64_t)s->ne[0];
  const bool per_tensor_ok = t.type == GgmlType::TERNARY;
  if (n != w.rows && !(per_tensor_ok && n == 1))
    fail("{}: scale tensor '{}' has {} values; expected {} (one per row){}", r.path(), sn, n, w.rows,
         per_tensor_ok ? " or 1" : "");
  w.scale = (const float*)s->data;  // GGUF data is aligned (32 bytes by default)
  w.scale_group = w.cols;
  w.scale_row_stride = n == 1 && w.rows != 1 ? 0 : 1;
  if (scale_name) *scale_name = sn;
  return w;
}

WeightView prepare_lowbit(ModelData& m, const WeightView& w, const std::string& where) {
  switch (w.type) {
    case GgmlType::F8_E4M3:
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
        for (int64_t c = 0; c < w.cols; ++c)
          if (fp8_e4m3_is_nan(row[c]))
            fail("{}: F8_E4M3 weight ({}, {}) is NaN (code 0x{:02x})", where, r, c, row[c]);
      }
      return w;
    case GgmlType::TERNARY:
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint32_t* words = (const uint32_t*)((const uint8_t*)w.data + r * w.row_bytes);
        for (int64_t k = 0; k < w.cols / kTernaryPerWord; ++k)
          if (!ternary_word_valid(words[k]))
            fail("{}: TERNARY row {} word {} (0x{:08x}) has the invalid code 11", where, r, k, words[k]);
      }
      return w;
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0: {
      const int64_t nb = w.cols / kQK_K;
      std::vector<uint32_t>& words = m.owned_words.emplace_back((size_t)(w.rows * w.cols / kTernaryPerWord));
      std::vector<float>& scales = m.owned.emplace_back((size_t)(w.rows * nb));
      int8_t t[kQK_K];
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          uint16_t d;
          if (w.type == GgmlType::TQ1_0) {
            const BlockTQ1_0& blk = ((const BlockTQ1_0*)row)[b];
            tq1_0_trits(blk, t);
            d = blk.d;
          } else {
            const BlockTQ2_0& blk = ((const BlockTQ2_0*)row)[b];
            if (!tq2_0_trits(blk, t))
              fail("{}: TQ2_0 row {} block {} has code 3 (ggml's +2), which is not a ternary weight", where,
                   r, b);
            d = blk.d;
          }
          ternary_pack(t, kQK_K, &words[(size_t)((r * w.cols + b * kQK_K) / kTernaryPerWord)]);
          scales[(size_t)(r * nb + b)] = fp16_to_fp32(d);
        }
      }
      WeightView v;
      v.type = GgmlType::TERNARY;
      v.data = words.data();
      v.rows = w.rows;
      v.cols = w.cols;
      v.row_bytes = (size_t)w.cols / kTernaryPerWord * 4;
      v.scale = scales.data();
      v.scale_group = kQK_K;
      v.scale_row_stride = nb;
      return v;
    }
    default:
      return w;
  }
}

}  // namespace ultra
