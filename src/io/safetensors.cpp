#include "io/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/json.h"

namespace ultra::safetensors {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB, as the reference implementation
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

struct DtypeInfo {
  std::string_view name;
  uint32_t bits;                 // bits per element (the F4/F6 types pack several elements per byte)
  std::optional<GgmlType> ggml;  // set for the types the engine computes with
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", 64, std::nullopt},    {"F32", 32, GgmlType::F32},        {"F16", 16, GgmlType::F16},
    {"BF16", 16, GgmlType::BF16}, {"I64", 64, std::nullopt},         {"I32", 32, std::nullopt},
    {"I16", 16, std::nullopt},    {"I8", 8, std::nullopt},           {"U64", 64, std::nullopt},
    {"U32", 32, std::nullopt},    {"U16", 16, std::nullopt},         {"U8", 8, std::nullopt},
    {"BOOL", 8, std::nullopt},    {"F8_E4M3", 8, GgmlType::F8_E4M3}, {"F8_E5M2", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt}, {"F6_E2M3", 6, std::nullopt},      {"F6_E3M2", 6, std::nullopt},
    {"F4", 4, std::nullopt},      {"C64", 64, std::nullopt},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// A JSON integer >= 0 (nlohmann keeps positive literals as unsigned, negative ones as signed, others as
// float).
std::optional<uint64_t> as_count(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return (uint64_t)v.get<int64_t>();
  return std::nullopt;
}

// File layout: u64 N (little-endian), N bytes of JSON, then the data section; data_offsets are relative to
// the data section's start.
uint64_t read_header_length(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 8) fail("{}: file too short ({} bytes) for the 8-byte header length", name, size);
  uint64_t n;
  std::memcpy(&n, data, 8);
  if (n > size - 8) fail("{}: header length {} exceeds the file size {}", name, n, size);
  if (n > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the limit of {} bytes", name, n, kMaxHeaderBytes);
  return n;
}

// One header entry: "name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}.
// Checks: known dtype, shape of non-negative ints whose product (times the dtype size) does not overflow,
// begin <= end <= data section size, end - begin == the byte size of the shape.
Tensor parse_entry(const std::string& file, const std::string& tname, const json& e, const uint8_t* section,
                   uint64_t section_size) {
  if (!e.is_object()) fail("{}: tensor '{}': entry is not a JSON object", file, tname);
  Tensor t;
  t.name = tname;
  t.file = file;

  auto dtype_it = e.find("dtype");
  if (dtype_it == e.end() || !dtype_it->is_string())
    fail("{}: tensor '{}' has no \"dtype\" string", file, tname);
  t.dtype = dtype_it->get<std::string>();
  const DtypeInfo* dt = find_dtype(t.dtype);
  if (!dt) fail("{}: tensor '{}' has unknown dtype '{}'", file, tname, t.dtype);
  t.type_supported = dt->ggml.has_value();
  t.type = dt->ggml.value_or(GgmlType::F32);

  auto shape_it = e.find("shape");
  if (shape_it == e.end() || !shape_it->is_array())
    fail("{}: tensor '{}' has no \"shape\" array", file, tname);
  uint64_t n_elements = 1;
  bool overflow = false;
  for (const json& d : *shape_it) {
    auto n = as_count(d);
    if (!n) fail("{}: tensor '{}' shape entry {} is not a non-negative integer", file, tname, dump_json(d));
    t.shape.push_back(*n);
    overflow |= __builtin_mul_overflow(n_elements, *n, &n_elements);
  }
  uint64_t n_bits = 0;
  if (overflow || __builtin_mul_overflow(n_elements, (uint64_t)dt->bits, &n_bits)) {
    fail("{}: tensor '{}' shape [{}] of {} overflows", file, tname, fmt::join(t.shape, ", "), t.dtype);
  }
  if (n_bits % 8 != 0) {
    fail("{}: tensor '{}' shape [{}] of {} is not a whole number of bytes", file, tname,
         fmt::join(t.shape, ", "), t.dtype);
  }
  t.n_bytes = n_bits / 8;

  auto off_it = e.find("data_offsets");
  if (off_it == e.end() || !off_it->is_array() || off_it->size() != 2) {
    fail("{}: tensor '{}' has no \"data_offsets\" [begin, end] pair", file, tname);
  }
  const auto begin = as_count((*off_it)[0]), end = as_count((*off_it)[1]);
  if (!begin || !end)
    fail("{}: tensor '{}' data_offsets {} are not non-negative integers", file, tname, dump_json(*off_it));
  if (*end < *begin)
    fail("{}: tensor '{}' data_offsets [{}, {}] end before they begin", file, tname, *begin, *end);
  if (*end > section_size) {
    fail("{}: tensor '{}' data_offsets [{}, {}] lie outside the data section ({} bytes)", file, tname, *begin,
         *end, section_size);
  }
  if (*end - *begin != t.n_bytes) {
    fail("{}: tensor '{}' size mismatch: data_offsets [{}, {}] hold {} bytes but shape [{}] of {} needs {}",
         file, tname, *begin, *end, *end - *begin, fmt::join(t.shape, ", "), t.dtype, t.n_bytes);
  }
  t.data = section + *begin;
  return t;
}

// The reference implementation's rule: sorted by offset, the tensors cover the data section exactly, each
// starting where the previous one ends (zero-size tensors included), the last ending at the end of the
// file. A gap or an overlap means a broken writer or a header length that is off (which would shift every
// tensor), so both are errors naming the bytes and the tensors.
void check_coverage(const std::string& file, std::vector<Tensor>& tensors, const uint8_t* section,
                    uint64_t section_size, uint64_t header_len) {
  std::sort(tensors.begin(), tensors.end(), [](const Tensor& a, const Tensor& b) {
    return a.data != b.data ? a.data < b.data : a.n_bytes < b.n_bytes;
  });
  uint64_t start = 0;            // where the next tensor must begin
  const Tensor* prev = nullptr;  // the tensor that ends at `start`
  for (const Tensor& t : tensors) {
    const uint64_t begin = (uint64_t)(t.data - section), end = begin + t.n_bytes;
    if (begin < start) {
      fail("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", file, prev->name, start - prev->n_bytes,
           start, t.name, begin, end);
    }
    if (begin > start) {
      fail("{}: bytes [{}, {}) of the data section belong to no tensor (before '{}' [{}, {}])", file, start,
           begin, t.name, begin, end);
    }
    start = end;
    prev = &t;
  }
  if (start != section_size) {
    fail(
        "{}: bytes [{}, {}) at the end of the data section ({} bytes after the header of {}) belong to no "
        "tensor",
        file, start, section_size, section_size, header_len);
  }
}

std::vector<Tensor> parse_tensors(const uint8_t* data, size_t size, const std::string& name) {
  const uint64_t header_len = read_header_length(data, size, name);
  const json header = parse_json(std::string_view(reinterpret_cast<const char*>(data) + 8, header_len), name);
  if (!header.is_object()) fail("{}: header is not a JSON object (got {})", name, header.type_name());
  const uint8_t* section = data + 8 + header_len;
  const uint64_t section_size = size - 8 - header_len;
  std::vector<Tensor> tensors;
  tensors.reserve(header.size());
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    tensors.push_back(parse_entry(name, key, entry, section, section_size));
  }
  check_coverage(name, tensors, section, section_size, header_len);
  return tensors;
}

// A shard name from weight_map, resolved inside the model directory; names escaping it are rejected.
fs::path shard_path(const std::string& index_name, const fs::path& dir, const std::string& shard) {
  const fs::path p(shard);
  bool escapes = shard.empty() || p.is_absolute();
  for (const auto& part : p) escapes |= part == "..";
  if (escapes)
    fail("{}: shard file name '{}' is not a plain name inside the model directory", index_name, shard);
  return dir / p;
}

bool file_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
  auto f = std::make_unique<File>();
  f->map_ = MappedFile(path, "safetensors file");
  f->tensors_ = parse_tensors(f->map_.data(), f->map_.size(), path);
  return f;
}

std::unique_ptr<File> File::parse(const uint8_t* data, size_t size, const std::string& name) {
  auto f = std::make_unique<File>();
  f->tensors_ = parse_tensors(data, size, name);
  return f;
}

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}.
// Each distinct shard is opened once; every tensor of every shard is visible; a tensor in two shards, or
// listed in weight_map but absent from its shard, is an error.
Checkpoint Checkpoint::open_dir(const std::string& dir) {
  Checkpoint ck;
  const fs::path index_path = fs::path(dir) / kIndexName;
  std::vector<std::pair<std::string, std::string>> listed;  // (tensor, shard) from weight_map
  if (file_exists(index_path)) {
    const std::string index_name = index_path.string();
    const MappedFile index_file(index_name, "index file");
    const json index = parse_json(
        std::string_view(reinterpret_cast<const char*>(index_file.data()), index_file.size()), index_name);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail("{}: no \"weight_map\" object", index_name);
    }
    std::unordered_map<std::string, size_t> shard_files;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) fail("{}: weight_map entry '{}' is not a file name string", index_name, tensor);
      const std::string& shard_name = shard.get_ref<const std::string&>();
      listed.emplace_back(tensor, shard_name);
      if (shard_files.count(shard_name)) continue;
      shard_files.emplace(shard_name, ck.files_.size());
      ck.files_.push_back(File::open(shard_path(index_name, dir, shard_name).string()));
    }
    for (const auto& file : ck.files_) {
      for (const Tensor& t : file->tensors()) {
        auto [it, added] = ck.by_name_.emplace(t.name, t);
        if (!added)
          fail("{}: tensor '{}' is defined in both {} and {}", dir, t.name, it->second.file, t.file);
      }
    }
    for (const auto& [tensor, shard] : listed) {
      auto it = ck.by_name_.find(tensor);
      const std::string shard_file = shard_path(index_name, dir, shard).string();
      if (it == ck.by_name_.end() || it->second.file != shard_file) {
        fail("{}: tensor '{}' is listed in weight_map for shard '{}' but is missing from it", index_name,
             tensor, shard);
      }
    }
  } else if (file_exists(fs::path(dir) / kSingleName)) {
    ck.files_.push_back(File::open((fs::path(dir) / kSingleName).string()));
    for (const Tensor& t : ck.files_.back()->tensors()) ck.by_name_.emplace(t.name, t);
  } else {
    fail("{}: no {} or {}", dir, kSingleName, kIndexName);
  }
  return ck;
}

const Tensor* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &it->second;
}

}  // namespace ultra::safetensors
