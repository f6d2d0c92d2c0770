// Helpers shared by the two model loaders (load_gguf.cpp, load_hf.cpp).
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "model/tensor_names.h"

namespace ultra {

// "N tensors are not used by the model: 'a', 'b', ... and K more" (sorted), for the loaders' check that
// every tensor of a file is used.
std::string unused_tensors_message(std::vector<std::string> names);

// m.rope_inv_freq (and the sliding-layer and longrope-long tables where the model has them) from m.hp.
void set_rope_tables(ModelData& m);

// Fills m.layers[0, m.hp.n_layers) from the per-layer rows of the tensor table (tensor_names.h), in table
// order, for a file of format f. The loader L provides: has(name); matrix(name, rows, cols), which checks
// the shape and fails naming the tensor and the file when it is missing; vec(name, n, shift) likewise, and
// vec2(name, rows, cols) for a [rows, cols] tensor loaded as rows * cols floats; and,
// where one tensor holds every expert (GGUF), experts(name, n_expert, rows, cols): the experts' views.
template <class Loader>
void load_layer_tensors(ModelData& m, Loader& L, TensorFormat f) {
  const HParams& hp = m.hp;
  m.layers.resize(hp.n_layers);
  for (int il = 0; il < hp.n_layers; ++il) {
    LayerWeights& l = m.layers[il];
    for (const TensorSpec& t : layer_tensors()) {
      const Need need = tensor_need(t, hp, f);
      if (need == Need::Absent) continue;
      const std::string name = tensor_name(t, hp, f, il);
      if (need == Need::Optional && !L.has(name)) continue;
      if (t.experts) {
        const int64_t rows = dim_size(t.rows, hp), cols = dim_size(t.cols, hp);
        std::vector<WeightView>& v = m.owned_views.emplace_back();
        if constexpr (requires { L.experts(name, hp.n_expert, rows, cols); }) {
          v = L.experts(name, hp.n_expert, rows, cols);
        } else {
          for (int e = 0; e < hp.n_expert; ++e)
            v.push_back(L.matrix(tensor_name(t, hp, f, il, e), rows, cols));
        }
        l.*t.experts = v.data();
        continue;
      }
      if (!t.matrix) {
        l.*t.vector = t.cols == Dim::None ? L.vec(name, dim_size(t.rows, hp), norm_shift(t, hp, f))
                                          : L.vec2(name, dim_size(t.rows, hp), dim_size(t.cols, hp));
        continue;
      }
      l.*t.matrix = L.matrix(name, dim_size(t.rows, hp), dim_size(t.cols, hp));
      int64_t r0 = 0;
      for (const RowPart& p : t.parts) {
        if (!p.slot) break;
        const int64_t n = dim_size(p.rows, hp);
        l.*p.slot = row_slice(l.*t.matrix, r0, n);
        r0 += n;
      }
    }
  }
}

}  // namespace ultra
