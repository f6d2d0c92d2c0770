// Reader of tests/fixtures/quants/ggml_ref.bin (tools/quant_fixture_main.c writes it with llama.cpp's ggml):
// a fixed f32 input, its blocks per type as ggml quantises them (without and with importance weights), and
// ggml's dequantisation of the plain blocks.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ultra::test {

struct QuantFixtureType {
  GgmlType type;
  uint64_t row_bytes;
  std::vector<uint8_t> blocks;          // [rows * row_bytes], no importance weights
  std::vector<uint8_t> blocks_imatrix;  // [rows * row_bytes], QuantFixture::imatrix as the weights
  std::vector<float> dequant;           // [rows * cols], ggml's to_float of `blocks`
};

struct QuantFixture {
  uint32_t rows = 0, cols = 0;
  std::vector<std::pair<int64_t, uint64_t>> ggml_sizes;  // per type id: (block elements, block bytes)
  std::vector<float> input;                              // [rows * cols]
  std::vector<float> imatrix;                            // [cols]
  std::vector<QuantFixtureType> types;
  std::string error;  // non-empty: the file could not be read

  const QuantFixtureType* find(GgmlType t) const {
    for (const auto& q : types)
      if (q.type == t) return &q;
    return nullptr;
  }
};

inline QuantFixture load_quant_fixture(const char* path = "tests/fixtures/quants/ggml_ref.bin") {
  QuantFixture fx;
  std::ifstream f(path, std::ios::binary);
  auto rd = [&](void* p, size_t n) { f.read(static_cast<char*>(p), (std::streamsize)n); };
  uint32_t head[5] = {};
  rd(head, sizeof head);
  if (!f || head[0] != 0x58465155u || head[1] != 1) {
    fx.error = std::string(path) + ": missing or not a version-1 quant fixture";
    return fx;
  }
  fx.rows = head[2];
  fx.cols = head[3];
  fx.ggml_sizes.resize(head[4]);
  for (auto& s : fx.ggml_sizes) {
    rd(&s.first, 8);
    rd(&s.second, 8);
  }
  fx.input.resize((size_t)fx.rows * fx.cols);
  fx.imatrix.resize(fx.cols);
  rd(fx.input.data(), fx.input.size() * 4);
  rd(fx.imatrix.data(), fx.imatrix.size() * 4);
  uint32_t n = 0;
  rd(&n, 4);
  for (uint32_t i = 0; i < n && f; ++i) {
    QuantFixtureType q;
    uint32_t id = 0;
    rd(&id, 4);
    rd(&q.row_bytes, 8);
    q.type = static_cast<GgmlType>(id);
    q.blocks.resize(fx.rows * q.row_bytes);
    q.blocks_imatrix.resize(fx.rows * q.row_bytes);
    q.dequant.resize((size_t)fx.rows * fx.cols);
    rd(q.blocks.data(), q.blocks.size());
    rd(q.blocks_imatrix.data(), q.blocks_imatrix.size());
    rd(q.dequant.data(), q.dequant.size() * 4);
    fx.types.push_back(std::move(q));
  }
  if (!f) fx.error = std::string(path) + " is truncated";
  return fx;
}

}  // namespace ultra::test
