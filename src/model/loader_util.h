// Helpers shared by the two model loaders (load_gguf.cpp, load_hf.cpp).
#pragma once

#include <string>
#include <vector>

namespace ultra {

// "N tensors are not used by the model: 'a', 'b', ... and K more" (sorted), for the loaders' check that
// every tensor of a file is used.
std::string unused_tensors_message(std::vector<std::string> names);

struct ModelData;
// m.rope_inv_freq (and the sliding-layer and longrope-long tables where the model has them) from m.hp.
void set_rope_tables(ModelData& m);

}  // namespace ultra
