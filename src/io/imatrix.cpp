#include "io/imatrix.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "core/error.h"
#include "io/gguf.h"

namespace ultra {

namespace {

void check_finite(const std::string& path, const std::string& name, const std::vector<float>& w) {
  for (float v : w)
    if (!std::isfinite(v)) fail("{}: imatrix entry '{}' holds a non-finite value ({})", path, name, v);
}

Imatrix load_gguf(const std::string& path) {
  const gguf::Reader r = gguf::Reader::open(path);
  Imatrix im;
  if (const gguf::Value* v = r.find("imatrix.datasets");
      v && v->arr && v->arr->elem_type == gguf::ValueType::STRING)
    for (size_t i = 0; i < v->arr->size(); ++i) im.datasets.emplace_back(v->arr->string_at(i));
  im.chunk_count = (int)r.get_uint_opt("imatrix.chunk_count").value_or(0);
  // name -> (in_sum2, counts)
  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> parts;
  for (const auto& t : r.tensors()) {
    if (t.name.ends_with(".in_sum2"))
      parts[t.name.substr(0, t.name.size() - 8)].first = &t;
    else if (t.name.ends_with(".counts"))
      parts[t.name.substr(0, t.name.size() - 7)].second = &t;
  }
  for (const auto& [name, p] : parts) {
    const auto [sums, counts] = p;
    if (!sums || !counts)
      fail("{}: imatrix entry '{}' has {} but no {}", path, name, sums ? ".in_sum2" : ".counts",
           sums ? ".counts" : ".in_sum2");
    if (sums->type != GgmlType::F32 || counts->type != GgmlType::F32)
      fail("{}: imatrix entry '{}': .in_sum2 and .counts must be F32", path, name);
    const uint64_t n = sums->n_elements, n_mat = counts->n_elements;
    if (n_mat == 0 || n % n_mat != 0 || sums->ne[0] != n / n_mat)
      fail("{}: imatrix entry '{}': {} sums do not split into {} matrices of {} columns", path, name, n,
           n_mat, sums->ne[0]);
    const uint64_t cols = n / n_mat;
    std::vector<float> s(n), c(n_mat), w(n);
    std::memcpy(s.data(), sums->data, 4 * n);
    std::memcpy(c.data(), counts->data, 4 * n_mat);
    for (uint64_t j = 0; j < n_mat; ++j) {
      if (!std::isfinite(c[j]) || c[j] < 0) fail("{}: imatrix entry '{}' has count {}", path, name, c[j]);
      const float count = (float)std::lround(c[j]);
      for (uint64_t i = 0; i < cols; ++i) w[j * cols + i] = count > 0.0f ? s[j * cols + i] / count : 1.0f;
    }
    check_finite(path, name, w);
    im.weights.emplace(name, std::move(w));
  }
  return im;
}

Imatrix load_legacy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open the imatrix file", path);
  f.seekg(0, std::ios::end);
  const auto size = (uint64_t)f.tellg();
  f.seekg(0);
  auto rd_i32 = [&](const char* what) {
    int32_t v = 0;
    if (!f.read(reinterpret_cast<char*>(&v), 4))
      fail("{}: truncated legacy imatrix (reading {})", path, what);
    return v;
  };
  Imatrix im;
  const int32_t n_entries = rd_i32("the entry count");
  if (n_entries < 1) fail("{}: not an imatrix file (neither GGUF nor a legacy .dat with entries)", path);
  for (int32_t e = 0; e < n_entries; ++e) {
    const int32_t len = rd_i32("a name length");
    if (len < 1 || (uint64_t)len > size)
      fail("{}: legacy imatrix entry {} has a name of {} bytes", path, e, len);
    std::string name(len, '\0');
    if (!f.read(name.data(), len)) fail("{}: truncated legacy imatrix (entry {}'s name)", path, e);
    name.resize(std::strlen(name.c_str()));
    const int32_t ncall = rd_i32("a call count");
    const int32_t nval = rd_i32("a value count");
    if (nval < 1 || (uint64_t)nval * 4 > size)
      fail("{}: legacy imatrix entry '{}' has {} values", path, name, nval);
    std::vector<float> w(nval);
    if (!f.read(reinterpret_cast<char*>(w.data()), 4 * (std::streamsize)nval))
      fail("{}: truncated legacy imatrix (entry '{}'s values)", path, name);
    if (ncall > 0)
      for (float& v : w) v /= (float)ncall;
    check_finite(path, name, w);
    im.weights[name] = std::move(w);
  }
  int32_t chunks = 0, len = 0;  // optional trailer: chunk count and dataset name
  if (f.read(reinterpret_cast<char*>(&chunks), 4)) {
    im.chunk_count = chunks;
    if (f.read(reinterpret_cast<char*>(&len), 4) && len > 0 && (uint64_t)len <= size) {
      std::string ds(len, '\0');
      if (f.read(ds.data(), len)) im.datasets.push_back(ds.c_str());
    }
  }
  return im;
}

}  // namespace

Imatrix load_imatrix(const std::string& path) {
  char magic[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("{}: cannot open the imatrix file", path);
    f.read(magic, 4);
  }
  Imatrix im = std::memcmp(magic, "GGUF", 4) == 0 ? load_gguf(path) : load_legacy(path);
  if (im.weights.empty()) fail("{}: the imatrix holds no entries", path);
  return im;
}

}  // namespace ultra
