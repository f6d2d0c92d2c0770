// HF safetensors: u64 header length, JSON header {name: {dtype, shape, data_offsets:[begin,end]}, ...,
// "__metadata__": {...}}, then the data. Sharded checkpoints use model.safetensors.index.json
// ({"weight_map": {tensor: file}}). Tensor data is used in place from the map.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"

namespace ultra::safetensors {

struct Tensor {
  std::string name;
  std::string dtype;              // "F32", "F16", "BF16", ... as in the header
  GgmlType type = GgmlType::F32;  // F32/F16/BF16/F8_E4M3 (others: the loader rejects them by name)
  bool type_supported = false;    // false for dtypes other than F32/F16/BF16/F8_E4M3 (F8: matrices only)
  std::vector<uint64_t> shape;    // row-major, as in PyTorch: shape[0] is the slowest
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;
  std::string file;  // path of the shard holding it
};

// One .safetensors file, validated: header length inside the file and sane (< 100 MB), valid JSON object,
// every entry with a known dtype string, shape product * dtype size == end - begin without overflow,
// offsets inside the data section, and the tensors covering the data section exactly (no gap, no overlap,
// nothing after the last one: the reference implementation's rule). Throws ultra::Error naming the file and
// the tensor.
class File {
 public:
  static std::unique_ptr<File> open(const std::string& path);
  static std::unique_ptr<File> parse(const uint8_t* data, size_t size, const std::string& name);
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  MappedFile map_;
  std::vector<Tensor> tensors_;
};

// A model directory: model.safetensors, or model.safetensors.index.json with its shards.
class Checkpoint {
 public:
  static Checkpoint open_dir(const std::string& dir);
  const Tensor* find(std::string_view name) const;
  const std::unordered_map<std::string, Tensor>& all() const { return by_name_; }

 private:
  std::vector<std::unique_ptr<File>> files_;
  std::unordered_map<std::string, Tensor> by_name_;
};

}  // namespace ultra::safetensors
