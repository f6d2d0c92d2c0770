// `ultra quantize` in llama.cpp's mixes (io/quant_mix.h) with importance weights (io/imatrix.h):
//   - the bundled target (rows of 384: most tensors take llama.cpp's fallbacks) in Q4_K_M gets, tensor for
//     tensor, the types llama-quantize chose for the same file (recorded below);
//   - importance matrices in llama.cpp's GGUF and legacy formats read as llama-quantize reads them, and bad
//     ones refused with a message;
//   - when llama.cpp's own llama-quantize is built (bench/llamacpp_build.py's native build), a synthetic
//     model with rows multiple of 256 in every mix, without and with an imatrix: the same type for every
//     tensor and the same bytes for every block; without it, the hashes of llama-quantize's files, recorded
//     here, against ours.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/dtype.h"
#include "io/gguf.h"
#include "io/imatrix.h"
#include "io/quant_mix.h"
#include "sanitized.h"
#include "tmp_dir.h"
#include "ultra/convert.h"
#include "ultra/error.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;
const std::string kTarget = (kRoot / "models" / "target.gguf").string();

std::string quantize(const std::string& in, const std::string& out, const std::string& type,
                     const std::string& imatrix = "") {
  ConvertOptions opt;
  opt.out_type = type;
  opt.imatrix = imatrix;
  opt.threads = 2;
  quantize_model(in, out, opt);
  return out;
}

std::map<std::string, GgmlType> tensor_types(const std::string& path) {
  std::map<std::string, GgmlType> m;
  const auto r = gguf::Reader::open(path);
  for (const auto& t : r.tensors()) m[t.name] = t.type;
  return m;
}

TEST(QuantizeMix, TargetQ4KMTypesEqualLlamaQuantizes) {
  test::TmpDir dir("ultra_qmix");
  const std::string out = quantize(kTarget, dir.file("q4km.gguf"), "q4_k_m");
  // llama-quantize models/target.gguf OUT q4_k_m: attn_v in use_more_bits layers Q6_K -> Q8_0 (384 columns),
  // the others Q4_K -> Q5_0; ffn_down (1024 columns) Q6_K / Q4_K; token_embd (tied) Q6_K -> Q8_0.
  const char* attn_v[8] = {"Q8_0", "Q5_0", "Q5_0", "Q8_0", "Q5_0", "Q5_0", "Q8_0", "Q8_0"};
  const char* ffn_down[8] = {"Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"};
  std::map<std::string, std::string> want = {{"token_embd.weight", "Q8_0"}, {"output_norm.weight", "F32"}};
  for (int il = 0; il < 8; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    for (const char* n : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
      want[b + n + ".weight"] = "Q5_0";
    want[b + "attn_norm.weight"] = want[b + "ffn_norm.weight"] = "F32";
    want[b + "attn_v.weight"] = attn_v[il];
    want[b + "ffn_down.weight"] = ffn_down[il];
  }
  const auto got = tensor_types(out);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, type] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(type_name(got.at(name)), type) << name;
  }
  const auto r = gguf::Reader::open(out);
  EXPECT_EQ(r.get_uint("general.file_type"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  EXPECT_EQ(r.get_string("tokenizer.ggml.model"),
            gguf::Reader::open(kTarget).get_string("tokenizer.ggml.model"));
}

TEST(QuantizeMix, MixNamesAndErrors) {
  EXPECT_STREQ(find_quant_mix("Q4_K_M")->name, "q4_k_m");
  EXPECT_STREQ(find_quant_mix("q4_k")->name, "q4_k_m");  // llama-quantize's alias
  EXPECT_EQ(find_quant_mix("q4_k_x"), nullptr);
  test::TmpDir dir("ultra_qmix");
  try {
    quantize(kTarget, dir.file("x.gguf"), "q4_q");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k_m"), std::string::npos) << e.what();  // lists the mixes
  }
  EXPECT_THROW(quantize(kTarget, dir.file("x.gguf"), "q8_0", kTarget), Error);  // imatrix for a plain type
  EXPECT_THROW(quantize(kTarget, dir.file("x.gguf"), "q4_k_m", dir.file("none.imatrix")), Error);
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
  // a file already in a mix: its block-quantized tensors are not requantized (llama-quantize's default)
  const std::string q = quantize(kTarget, dir.file("q.gguf"), "q4_k_m");
  try {
    quantize(q, dir.file("x.gguf"), "q6_k");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has type Q5_0; the mixes quantize F32, F16, BF16 or Q8_0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

// An imatrix GGUF as llama-imatrix writes it: per matrix "<name>.in_sum2" [cols, 1] and "<name>.counts" [1].
struct ImatrixFile {
  std::map<std::string, std::vector<float>> sums;
  std::map<std::string, float> counts;
  void write(const std::string& path) const {
    gguf::Writer w;
    w.set_string("general.type", "imatrix");
    w.set_array_string("imatrix.datasets", {"synthetic.txt"});
    w.set_u32("imatrix.chunk_count", 10);
    w.set_u32("imatrix.chunk_size", 512);
    for (const auto& [name, s] : sums) {
      w.add_tensor(name + ".in_sum2", GgmlType::F32, {s.size(), 1}, s.data(), 4 * s.size());
      w.add_tensor(name + ".counts", GgmlType::F32, {1, 1}, &counts.at(name), 4);
    }
    w.write(path);
  }
};

// Importance sums for every matrix of a file but token_embd: positive, varying per column.
ImatrixFile imatrix_for(const std::string& model) {
  ImatrixFile im;
  uint32_t s = 12345;
  const auto r = gguf::Reader::open(model);
  for (const auto& t : r.tensors()) {
    if (t.ne.size() != 2 || t.ne[1] == 1 || t.name == "token_embd.weight") continue;
    std::vector<float> v(t.ne[0]);
    for (float& x : v) {
      s = s * 1664525u + 1013904223u;
      x = 5120.0f * (0.05f + (float)(s >> 8) / (1 << 24) * (s % 7 == 0 ? 20.0f : 1.0f));
    }
    im.sums[t.name] = v;
    im.counts[t.name] = 5120.0f;
  }
  return im;
}

TEST(QuantizeMix, ImatrixFormatsReadAsLlamaQuantizeReadsThem) {
  test::TmpDir dir("ultra_qmix");
  ImatrixFile f;
  f.sums["a.weight"] = {2.0f, 4.0f, 9.0f};
  f.counts["a.weight"] = 2.0f;
  f.sums["b.weight"] = {3.0f, 5.0f};
  f.counts["b.weight"] = 0.0f;  // never called: weights 1
  f.write(dir.file("m.imatrix"));
  const Imatrix im = load_imatrix(dir.file("m.imatrix"));
  EXPECT_EQ(im.weights.at("a.weight"), (std::vector<float>{1.0f, 2.0f, 4.5f}));
  EXPECT_EQ(im.weights.at("b.weight"), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(im.chunk_count, 10);
  ASSERT_EQ(im.datasets.size(), 1u);
  EXPECT_EQ(im.datasets[0], "synthetic.txt");

  // legacy .dat: n_entries, then name length, name, ncall, n_values, values; trailer chunk count + dataset
  auto dat = [&](const std::string& path, bool truncate) {
    std::ofstream o(path, std::ios::binary);
    auto i32 = [&](int32_t v) { o.write(reinterpret_cast<const char*>(&v), 4); };
    i32(1);
    i32(8);
    o.write("c.weight", 8);
    i32(4);  // ncall
    i32(2);
    const float v[2] = {8.0f, 2.0f};
    o.write(reinterpret_cast<const char*>(v), truncate ? 4 : 8);
    if (!truncate) {
      i32(7);
      i32(3);
      o.write("wik", 3);
    }
  };
  dat(dir.file("m.dat"), false);
  const Imatrix legacy = load_imatrix(dir.file("m.dat"));
  EXPECT_EQ(legacy.weights.at("c.weight"), (std::vector<float>{2.0f, 0.5f}));
  EXPECT_EQ(legacy.chunk_count, 7);
  EXPECT_EQ(legacy.datasets, std::vector<std::string>{"wik"});

  auto expect_error = [](const std::string& path, const std::string& part) {
    try {
      load_imatrix(path);
      ADD_FAILURE() << path << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  dat(dir.file("trunc.dat"), true);
  expect_error(dir.file("trunc.dat"), "truncated");
  expect_error(dir.file("missing.dat"), "cannot open");
  {
    gguf::Writer w;  // sums without counts
    const float s[2] = {1, 2};
    w.add_tensor("x.weight.in_sum2", GgmlType::F32, {2, 1}, s, 8);
    w.write(dir.file("nocounts.imatrix"));
  }
  expect_error(dir.file("nocounts.imatrix"), "no .counts");
  ImatrixFile bad;
  bad.sums["a.weight"] = {1.0f, NAN};
  bad.counts["a.weight"] = 1.0f;
  bad.write(dir.file("nan.imatrix"));
  expect_error(dir.file("nan.imatrix"), "non-finite");
}

TEST(QuantizeMix, ImportanceWeightsChangeTheBlocksAndAreChecked) {
  test::TmpDir dir("ultra_qmix");
  imatrix_for(kTarget).write(dir.file("t.imatrix"));
  const std::string plain = quantize(kTarget, dir.file("plain.gguf"), "q4_k_m");
  const std::string weighted = quantize(kTarget, dir.file("w.gguf"), "q4_k_m", dir.file("t.imatrix"));
  const auto a = gguf::Reader::open(plain), b = gguf::Reader::open(weighted);
  const auto* ta = a.find_tensor("blk.0.ffn_down.weight");
  const auto* tb = b.find_tensor("blk.0.ffn_down.weight");
  ASSERT_TRUE(ta && tb);
  ASSERT_EQ(ta->n_bytes, tb->n_bytes);
  EXPECT_NE(std::memcmp(ta->data, tb->data, ta->n_bytes), 0);
  // an entry whose length is not the tensor's row length
  ImatrixFile wrong = imatrix_for(kTarget);
  wrong.sums["blk.3.attn_q.weight"].resize(100);
  wrong.write(dir.file("wrong.imatrix"));
  try {
    quantize(kTarget, dir.file("x.gguf"), "q4_k_m", dir.file("wrong.imatrix"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.3.attn_q.weight"), std::string::npos) << e.what();
  }
}

TEST(QuantizeMix, NonFiniteWeightsAreRefused) {
  test::TmpDir dir("ultra_qmix");
  const auto r = gguf::Reader::open(kTarget);
  gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  std::vector<uint8_t> bad;
  for (const auto& t : r.tensors()) {
    if (t.name == "blk.2.ffn_down.weight") {
      ASSERT_EQ(t.type, GgmlType::F16);
      bad.assign(t.data, t.data + t.n_bytes);
      const uint16_t nan = 0x7e00;
      std::memcpy(bad.data() + 2 * (5 * t.ne[0] + 7), &nan, 2);  // row 5
      w.add_tensor(t.name, t.type, t.ne, bad.data(), bad.size());
    } else {
      w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    }
  }
  w.write(dir.file("nan.gguf"));
  try {
    quantize(dir.file("nan.gguf"), dir.file("x.gguf"), "q4_k_m");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.2.ffn_down.weight': row 5 holds a non-finite value"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

// ---- against llama.cpp's llama-quantize ----

std::string llama_quantize_bin() {
  const char* home = std::getenv("HOME");
  const fs::path p =
      fs::path(home ? home : "/root") / ".cache/ultra/llama.cpp-native/build/bin/llama-quantize";
  return fs::exists(p) ? p.string() : "";
}

// The target's metadata (tokenizer included) with wider synthetic weights: dim 256, 4 heads of 64, 1 KV
// head (GQA 4), FFN 768, an untied output; F16 values with occasional outliers.
std::string wide_model(const test::TmpDir& dir) {
  const auto r = gguf::Reader::open(kTarget);
  const uint32_t dim = 256, ffn = 768, n_head = 4, n_kv = 1, hd = 64, n_layer = 8;
  const uint64_t n_vocab = r.find_tensor("token_embd.weight")->ne[1];
  static std::vector<std::vector<uint8_t>> store;  // tensor data until write()
  store.clear();
  uint64_t s = 0x9e3779b97f4a7c15ull;
  gguf::Writer out;
  for (const auto& [k, v] : r.metadata()) out.set_value(k, v);
  out.set_u32("llama.embedding_length", dim);
  out.set_u32("llama.feed_forward_length", ffn);
  out.set_u32("llama.attention.head_count", n_head);
  out.set_u32("llama.attention.head_count_kv", n_kv);
  out.set_u32("llama.rope.dimension_count", hd);
  out.set_u32("llama.block_count", n_layer);
  out.set_u32("general.file_type", 1);
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> shapes = {
      {"token_embd.weight", dim, n_vocab}, {"output_norm.weight", dim, 0}, {"output.weight", dim, n_vocab}};
  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    shapes.insert(shapes.end(), {{b + "attn_norm.weight", dim, 0},
                                 {b + "attn_q.weight", dim, n_head * hd},
                                 {b + "attn_k.weight", dim, n_kv * hd},
                                 {b + "attn_v.weight", dim, n_kv * hd},
                                 {b + "attn_output.weight", n_head * hd, dim},
                                 {b + "ffn_norm.weight", dim, 0},
                                 {b + "ffn_gate.weight", dim, ffn},
                                 {b + "ffn_up.weight", dim, ffn},
                                 {b + "ffn_down.weight", ffn, dim}});
  }
  for (const auto& [name, cols, rows] : shapes) {
    std::vector<uint8_t> b(rows == 0 ? 4 * cols : 2 * cols * rows);
    if (rows == 0) {
      for (uint64_t i = 0; i < cols; ++i) {
        const float one = 1.0f;
        std::memcpy(b.data() + 4 * i, &one, 4);
      }
    }
    for (uint64_t i = 0; rows && i < cols * rows; ++i) {
      double u = 0;
      for (int k = 0; k < 4; ++k) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        u += (double)(s >> 11) / 9007199254740992.0;
      }
      const float x = (float)((u - 2.0) * 0.05 * ((s >> 7) % 97 == 0 ? 12.0 : 1.0));
      const uint16_t h = fp32_to_fp16(x);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    store.push_back(std::move(b));
    if (rows == 0)
      out.add_tensor(name, GgmlType::F32, {cols}, store.back().data(), store.back().size());
    else
      out.add_tensor(name, GgmlType::F16, {cols, rows}, store.back().data(), store.back().size());
  }
  const std::string path = dir.file("wide.gguf");
  out.write(path);
  return path;
}

// FNV-1a over every tensor's name, type id and bytes, in name order: a file's content, whatever its tensor
// order and metadata.
uint64_t tensors_hash(const gguf::Reader& r) {
  std::map<std::string, const gguf::TensorInfo*> by_name;
  for (const auto& t : r.tensors()) by_name[t.name] = &t;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& [name, t] : by_name) {
    mix(name.data(), name.size());
    const uint32_t id = (uint32_t)t->type;
    mix(&id, 4);
    mix(t->data, t->n_bytes);
  }
  return h;
}

// The synthetic model, its imatrix and ultra's files of it and of the target, made once per test program and
// shared by the live comparisons and the recorded hashes below (quantize_model is deterministic: a second
// run writes the same bytes). Removed at exit.
const test::TmpDir& shared_dir() {
  static const test::TmpDir dir("ultra_qmix_shared");
  return dir;
}

const std::string& shared_wide() {
  static const std::string path = [] {
    const std::string p = wide_model(shared_dir());
    imatrix_for(p).write(shared_dir().file("wide.imatrix"));
    return p;
  }();
  return path;
}

std::string shared_imatrix() {
  shared_wide();
  return shared_dir().file("wide.imatrix");
}

// ultra's file of `model` in `mix` (with `imatrix` when not empty), quantised on first use.
std::string ours(const std::string& model, const std::string& mix, const std::string& imatrix) {
  const std::string out = shared_dir().file("ul-" + fs::path(model).stem().string() + "-" + mix +
                                            (imatrix.empty() ? "" : "-imatrix") + ".gguf");
  return fs::exists(out) ? out : quantize(model, out, mix, imatrix);
}

const char* const kAllMixes[] = {"q4_0",   "q4_1",   "q5_0",   "q5_1",   "q2_k", "q3_k_s", "q3_k_m", "q3_k_l",
                                 "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"};

// llama-quantize and ultra quantize `model` to `mix`: the same tensors, types and bytes, block for block.
void expect_same_as_llama_quantize(const std::string& bin, const test::TmpDir& dir, const std::string& model,
                                   const std::string& mix, const std::string& imatrix) {
  SCOPED_TRACE(mix + (imatrix.empty() ? "" : " imatrix"));
  const std::string theirs = dir.file("ll-" + mix + ".gguf");
  const std::string cmd = bin + (imatrix.empty() ? "" : " --imatrix " + imatrix) + " " + model + " " +
                          theirs + " " + mix + " 2 > " + dir.file("ll.log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto a = gguf::Reader::open(ours(model, mix, imatrix)), b = gguf::Reader::open(theirs);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  std::map<std::string, std::pair<int64_t, int64_t>> per_type;  // type -> (identical blocks, blocks)
  for (const auto& tb : b.tensors()) {
    const auto* ta = a.find_tensor(tb.name);
    ASSERT_NE(ta, nullptr) << tb.name;
    ASSERT_EQ(type_name(ta->type), type_name(tb.type)) << tb.name;
    ASSERT_EQ(ta->n_bytes, tb.n_bytes) << tb.name;
    const auto tt = *type_traits(tb.type);
    auto& [same, total] = per_type[std::string(type_name(tb.type))];
    for (uint64_t o = 0; o < tb.n_bytes; o += tt.block_bytes) {
      ++total;
      same += std::memcmp(ta->data + o, tb.data + o, tt.block_bytes) == 0;
    }
  }
  std::string summary;
  for (const auto& [type, c] : per_type) {
    summary += " " + type + " " + std::to_string(c.first) + "/" + std::to_string(c.second);
    EXPECT_EQ(c.first, c.second) << type << " blocks differ from llama-quantize's";
  }
  std::printf("[llama-quantize] %s %-7s%s:%s (hash 0x%016llx)\n", fs::path(model).stem().c_str(), mix.c_str(),
              imatrix.empty() ? "" : " imatrix", summary.c_str(), (unsigned long long)tensors_hash(b));
}

TEST(QuantizeMix, EveryMixEqualsLlamaQuantizeByteForByte) {
  const std::string bin = llama_quantize_bin();
  if (bin.empty())
    GTEST_SKIP() << "llama-quantize is not built (bench/llamacpp_build.py): comparison skipped";
  test::TmpDir dir("ultra_qmix");
  // A sample of the mixes (every third; under AddressSanitizer, ~15x slower, every fifth), the target's test
  // below another: EveryMixHashesAsLlamaQuantizesFiles checks every mix's bytes against llama-quantize's
  // recorded output, so these live runs keep the recorded hashes honest without repeating all 45 files.
  const size_t step = test::kSanitized ? 5 : 3;
  for (size_t i = 0; i < std::size(kAllMixes); i += step) {
    expect_same_as_llama_quantize(bin, dir, shared_wide(), kAllMixes[i], "");
    expect_same_as_llama_quantize(bin, dir, shared_wide(), kAllMixes[i], shared_imatrix());
  }
}

// The bundled target: rows of 384 and 1024, so the legacy fallbacks (Q5_0, Q5_1, Q4_0, Q8_0, IQ4_NL) too.
TEST(QuantizeMix, TargetEveryMixEqualsLlamaQuantizeByteForByte) {
  const std::string bin = llama_quantize_bin();
  if (bin.empty())
    GTEST_SKIP() << "llama-quantize is not built (bench/llamacpp_build.py): comparison skipped";
  test::TmpDir dir("ultra_qmix");
  const size_t first = test::kSanitized ? 2 : 1, step = test::kSanitized ? 5 : 3;  // a sample, as above
  for (size_t i = first; i < std::size(kAllMixes); i += step)
    expect_same_as_llama_quantize(bin, dir, kTarget, kAllMixes[i], "");
}

// The same comparison without llama.cpp: the hashes (tensors_hash) of the files llama-quantize wrote above
// (every mix of the synthetic model, plain and with the imatrix; the target in five mixes), recorded from its
// output (the synthetic model and imatrix are deterministic), against ultra's files.
TEST(QuantizeMix, EveryMixHashesAsLlamaQuantizesFiles) {
  struct Want {
    bool target;  // the bundled target, else the synthetic wide model
    const char* mix;
    bool imatrix;
    uint64_t hash;
  };
  const Want want[] = {
      {false, "q4_0", false, 0x5b1e3ec616a0c706ull},   {false, "q4_0", true, 0xe1be37fdbbbb9e7aull},
      {false, "q4_1", false, 0x76ec100fea99505bull},   {false, "q4_1", true, 0xbd576c1311509a1dull},
      {false, "q5_0", false, 0xcd728f421d664576ull},   {false, "q5_0", true, 0xd0403e406b8d5825ull},
      {false, "q5_1", false, 0xa046c60d9721401eull},   {false, "q5_1", true, 0x4295c144f113c337ull},
      {false, "q2_k", false, 0x860f0374a5bd56feull},   {false, "q2_k", true, 0xb45750a0550f302cull},
      {false, "q3_k_s", false, 0x5dbfac684f8704abull}, {false, "q3_k_s", true, 0xd0e6da043b78321full},
      {false, "q3_k_m", false, 0x252413c92f0ea59dull}, {false, "q3_k_m", true, 0xb0a28f266c404998ull},
      {false, "q3_k_l", false, 0x9488e7cfbc21cdc7ull}, {false, "q3_k_l", true, 0xc90af4d17b5f6275ull},
      {false, "q4_k_s", false, 0x3a85ea364c472b59ull}, {false, "q4_k_s", true, 0xe99e2a7df4b96fe4ull},
      {false, "q4_k_m", false, 0xbc4b5e31607b3ff3ull}, {false, "q4_k_m", true, 0x846d52520acdbc89ull},
      {false, "q5_k_s", false, 0xb9a58aa170e1ffdbull}, {false, "q5_k_s", true, 0x51ec75d2ac916371ull},
      {false, "q5_k_m", false, 0x8e455ea75e81d8a0ull}, {false, "q5_k_m", true, 0x02c239e866cff611ull},
      {false, "q6_k", false, 0x0e82bee851b627aaull},   {false, "q6_k", true, 0x16037571b8683c24ull},
      {false, "iq4_nl", false, 0xbd0ed57fd36e2852ull}, {false, "iq4_nl", true, 0x03d53117b3170092ull},
      {false, "iq4_xs", false, 0x2ff356258f21ac8aull}, {false, "iq4_xs", true, 0x84ccf60928806485ull},
      {true, "q4_0", false, 0x3555c22819a6c162ull},    {true, "q4_1", false, 0x04daa3cbffe4fbf9ull},
      {true, "q3_k_m", false, 0x155802f4b6674dbeull},  {true, "q3_k_l", false, 0xa6243d6bb5055277ull},
      {true, "q6_k", false, 0x78eb2e116c3e8b9cull},    {true, "iq4_nl", false, 0x7386ed5d887a7b76ull},
      {true, "iq4_xs", false, 0x78101cf4ed5436cbull},
  };
  const size_t step = test::kSanitized ? 8 : 1;  // ~15x slower under AddressSanitizer: a sample of the files
  for (size_t i = 0; i < std::size(want); i += step) {
    const Want& w = want[i];
    SCOPED_TRACE(std::string(w.target ? "target " : "wide ") + w.mix + (w.imatrix ? " imatrix" : ""));
    EXPECT_EQ(tensors_hash(gguf::Reader::open(
                  ours(w.target ? kTarget : shared_wide(), w.mix, w.imatrix ? shared_imatrix() : ""))),
              w.hash);
  }
}

}  // namespace
