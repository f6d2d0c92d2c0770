#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "tmp_dir.h"

using namespace ultra;
using namespace ultra::safetensors;
namespace fs = std::filesystem;

namespace {

const std::string kFuzzFixtures = std::string(ULTRA_SOURCE_DIR) + "/tests/fixtures/fuzz/safetensors";

// Unique directory per test (tmp_dir.h), named for this suite.
struct TmpDir : ultra::test::TmpDir {
  TmpDir() : ultra::test::TmpDir("ultra_st") {}
  std::string path() const { return ultra::test::TmpDir::path().string(); }
};

// File bytes: u64 little-endian header length, the JSON header, then the data section.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b(8 + header.size() + data.size());
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(b.data() + 8 + header.size(), data.data(), data.size());
  return b;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = (uint8_t)(k * 7 + 1);
  return v;
}

// A valid file: F32 [2, 3], BF16 [4], I64 [1] (not computable), a zero-size F16 [0, 4], metadata.
const std::string kValidHeader = R"({
  "__metadata__": {"format": "pt"},
  "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
  "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
  "step": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
  "empty": {"dtype": "F16", "shape": [0, 4], "data_offsets": [40, 40]}
})";

// Header of one F32 tensor "t" with the given shape and offsets, over `data_bytes` bytes of data.
std::vector<uint8_t> one_tensor(const std::string& dtype, const std::string& shape,
                                const std::string& offsets, size_t data_bytes) {
  return make_file(
      R"({"t": {"dtype": ")" + dtype + R"(", "shape": )" + shape + R"(, "data_offsets": )" + offsets + "}}",
      std::vector<uint8_t>(data_bytes));
}

template <typename Fn>
void expect_error_msg(Fn fn, const std::string& prefix, const std::string& phrase) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << phrase;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos)
        << "message: " << msg << "\nexpected to contain: " << phrase;
  }
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& phrase) {
  expect_error_msg([&] { File::parse(bytes.data(), bytes.size(), "bad.safetensors"); },
                   "bad.safetensors: ", phrase);
}

bool parses_or_errors(const uint8_t* data, size_t size, const std::string& name) {
  try {
    File::parse(data, size, name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

const Tensor* find(const File& f, const std::string& name) {
  for (const Tensor& t : f.tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace

TEST(Safetensors, ParsesAHandWrittenFile) {
  const std::vector<uint8_t> data = iota_bytes(40);
  const std::vector<uint8_t> bytes = make_file(kValidHeader, data);
  const auto f = File::parse(bytes.data(), bytes.size(), "mem.safetensors");
  ASSERT_EQ(f->tensors().size(), 4u);  // __metadata__ skipped
  // In data order.
  EXPECT_EQ(f->tensors()[0].name, "w");
  EXPECT_EQ(f->tensors()[1].name, "b");
  EXPECT_EQ(f->tensors()[2].name, "step");

  const uint8_t* section = bytes.data() + 8 + kValidHeader.size();
  const Tensor* w = find(*f, "w");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_TRUE(w->type_supported);
  EXPECT_EQ(w->type, GgmlType::F32);
  EXPECT_EQ(w->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(w->n_bytes, 24u);
  EXPECT_EQ(w->data, section);
  EXPECT_EQ(w->file, "mem.safetensors");

  const Tensor* b = find(*f, "b");
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->type_supported);
  EXPECT_EQ(b->type, GgmlType::BF16);
  EXPECT_EQ(b->data, section + 24);
  EXPECT_EQ(std::memcmp(b->data, data.data() + 24, 8), 0);

  const Tensor* step = find(*f, "step");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->dtype, "I64");
  EXPECT_FALSE(step->type_supported);
  EXPECT_EQ(step->n_bytes, 8u);

  const Tensor* empty = find(*f, "empty");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->type, GgmlType::F16);
  EXPECT_EQ(empty->n_bytes, 0u);
}

TEST(Safetensors, OpensAFileAndEveryDtypeSize) {
  TmpDir dir;
  // A scalar (shape []) of each dtype, laid out back to back; sizes in bytes.
  const std::vector<std::pair<std::string, int>> dtypes = {
      {"F64", 8},  {"F32", 4},     {"F16", 2},     {"BF16", 2},   {"I64", 8}, {"I32", 4},
      {"I16", 2},  {"I8", 1},      {"U64", 8},     {"U32", 4},    {"U16", 2}, {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
  std::string header = "{";
  uint64_t at = 0;
  for (const auto& [name, size] : dtypes) {
    header += fmt::format(R"("{}": {{"dtype": "{}", "shape": [], "data_offsets": [{}, {}]}},)", name, name,
                          at, at + size);
    at += size;
  }
  header += R"("f4": {"dtype": "F4", "shape": [2, 3], "data_offsets": [)" + std::to_string(at) + ", " +
            std::to_string(at + 3) + "]}}";
  at += 3;
  const std::string path = dir.file("all.safetensors");
  write_file(path, make_file(header, iota_bytes(at)));
  const auto f = File::open(path);
  ASSERT_EQ(f->tensors().size(), dtypes.size() + 1);
  for (const auto& [name, size] : dtypes) {
    const Tensor* t = find(*f, name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(t->n_bytes, (uint64_t)size) << name;
    EXPECT_EQ(t->file, path);
    EXPECT_EQ(t->type_supported, name == "F32" || name == "F16" || name == "BF16" || name == "F8_E4M3")
        << name;
  }
  EXPECT_EQ(find(*f, "f4")->n_bytes, 3u);
  expect_error(one_tensor("F4", "[3]", "[0, 2]", 2), "is not a whole number of bytes");
}

TEST(Safetensors, OpensASingleFileDirectory) {
  TmpDir dir;
  write_file(dir.file("model.safetensors"), make_file(kValidHeader, iota_bytes(40)));
  const Checkpoint ck = Checkpoint::open_dir(dir.path());
  EXPECT_EQ(ck.all().size(), 4u);
  const Tensor* w = ck.find("w");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->file, dir.file("model.safetensors"));
  EXPECT_EQ(std::memcmp(w->data, iota_bytes(40).data(), 24), 0);
  EXPECT_EQ(ck.find("nope"), nullptr);
}

TEST(Safetensors, OpensAShardedDirectory) {
  TmpDir dir;
  write_file(dir.file("model-00001-of-00002.safetensors"),
             make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]}})",
                       iota_bytes(12)));
  std::vector<uint8_t> data2(16, 0x5a);
  write_file(dir.file("model-00002-of-00002.safetensors"),
             make_file(R"({"c": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}})", data2));
  write_text(dir.file("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 28},
    "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  // A stray single file next to the index is ignored: the index wins.
  write_text(dir.file("model.safetensors"), "garbage");

  Checkpoint ck = Checkpoint::open_dir(dir.path());
  ASSERT_EQ(ck.all().size(), 3u);
  const Tensor* a = ck.find("a");
  const Tensor* c = ck.find("c");
  ASSERT_TRUE(a && c && ck.find("b"));
  EXPECT_EQ(a->file, dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(c->file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(c->type, GgmlType::BF16);
  EXPECT_EQ(c->shape, (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(c->data[15], 0x5a);
  EXPECT_EQ(std::memcmp(a->data, iota_bytes(8).data(), 8), 0);

  // Moving the checkpoint keeps the mappings (and data pointers) alive.
  const uint8_t* before = c->data;
  Checkpoint moved = std::move(ck);
  EXPECT_EQ(moved.find("c")->data, before);
  EXPECT_EQ(moved.find("c")->data[0], 0x5a);
}

TEST(Safetensors, RejectsBadDirectories) {
  {
    TmpDir dir;
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.path() + ": ",
                     "no model.safetensors or model.safetensors.index.json");
  }
  auto make_dir = [&](const TmpDir& dir, const std::string& index) {
    write_file(dir.file("s1.safetensors"),
               make_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", iota_bytes(4)));
    write_file(dir.file("s2.safetensors"),
               make_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "z": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                         iota_bytes(8)));
    write_text(dir.file("model.safetensors.index.json"), index);
  };
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": "s1.safetensors", "b": "missing.safetensors"}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("missing.safetensors"),
                     "cannot open");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "tensor 'b' is listed in weight_map for shard 's1.safetensors' but is missing from it");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": "s1.safetensors", "z": "s2.safetensors"}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.path(), "tensor 'a' is defined in both");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": "../s1.safetensors"}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "is not a plain name inside the model directory");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "JSON key 'a' appears twice");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"metadata": {}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "no \"weight_map\" object");
  }
  {
    TmpDir dir;
    make_dir(dir, R"({"weight_map": {"a": 3}})");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "weight_map entry 'a' is not a file name string");
  }
  {
    TmpDir dir;
    make_dir(dir, "{not json");
    expect_error_msg([&] { Checkpoint::open_dir(dir.path()); }, dir.file("model.safetensors.index.json"),
                     "invalid JSON");
  }
}

TEST(Safetensors, RejectsBadFiles) {
  expect_error({1, 2, 3, 4, 5}, "file too short (5 bytes)");
  expect_error({0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'}, "header length 1000 exceeds the file size 10");
  {
    std::vector<uint8_t> huge((101u << 20) + 8);
    const uint64_t n = 101u << 20;
    std::memcpy(huge.data(), &n, 8);
    expect_error(huge, "header length 105906176 exceeds the limit of 104857600 bytes");
  }
  expect_error(make_file("{\"a\": ", {}), "invalid JSON");
  expect_error(make_file("", {}), "invalid JSON");
  expect_error(make_file("[1, 2]", {}), "header is not a JSON object (got array)");
  expect_error(make_file(R"({"t": 5})", {}), "tensor 't': entry is not a JSON object");
  expect_error(make_file(R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(4)),
               "tensor 't' has no \"dtype\" string");
  expect_error(make_file(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", std::vector<uint8_t>(4)),
               "tensor 't' has no \"shape\" array");
  expect_error(make_file(R"({"t": {"dtype": "F32", "shape": [1]}})", std::vector<uint8_t>(4)),
               "tensor 't' has no \"data_offsets\" [begin, end] pair");
  expect_error(one_tensor("F33", "[1]", "[0, 4]", 4), "tensor 't' has unknown dtype 'F33'");
  expect_error(one_tensor("F32", "[-1]", "[0, 4]", 4), "shape entry -1 is not a non-negative integer");
  expect_error(one_tensor("F32", "[1.5]", "[0, 4]", 4), "shape entry 1.5 is not a non-negative integer");
  expect_error(one_tensor("F32", "[1]", "[0, 4, 8]", 8), "no \"data_offsets\" [begin, end] pair");
  expect_error(one_tensor("F32", "[1]", "[-4, 0]", 4), "are not non-negative integers");
  expect_error(one_tensor("F32", "[1]", "[8, 4]", 8), "data_offsets [8, 4] end before they begin");
  expect_error(one_tensor("F32", "[2]", "[0, 8]", 4),
               "data_offsets [0, 8] lie outside the data section (4 bytes)");
  expect_error(one_tensor("F32", "[1]", "[18446744073709551612, 18446744073709551615]", 4),
               "lie outside the data section");
  expect_error(one_tensor("F32", "[3]", "[0, 8]", 8),
               "size mismatch: data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12");
  expect_error(one_tensor("F32", "[1099511627776, 1099511627776]", "[0, 4]", 4),
               "shape [1099511627776, 1099511627776] of F32 overflows");
  expect_error(one_tensor("F64", "[4611686018427387904]", "[0, 4]", 4), "overflows");
  expect_error(one_tensor("F32", "[18446744073709551616]", "[0, 4]", 4), "is not a non-negative integer");
  expect_error(make_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                         std::vector<uint8_t>(12)),
               "tensors 'x' [0, 8] and 'y' [4, 12] overlap");
  expect_error(make_file(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                         std::vector<uint8_t>(8)),
               "JSON key 'x' appears twice in one object");
}

// JSON nesting is bounded (64 levels): a header of nested {"a": or [ fails as soon as the parser gets past
// the bound, instead of building (gigabytes of) nested values first.
TEST(Safetensors, JsonNestingIsBounded) {
  auto nested = [](int depth, const std::string& open, const std::string& close) {
    std::string s = R"({"__metadata__": )";
    for (int i = 1; i < depth; ++i) s += open;
    s += "1";
    for (int i = 1; i < depth; ++i) s += close;
    return s + "}";
  };
  // 64 levels (the root object included) parse; 65 do not.
  const std::vector<uint8_t> ok = make_file(nested(64, R"({"a": )", "}"), {});
  EXPECT_TRUE(parses_or_errors(ok.data(), ok.size(), "ok"));
  const std::vector<uint8_t> ok_arrays = make_file(nested(64, "[", "]"), {});
  EXPECT_TRUE(parses_or_errors(ok_arrays.data(), ok_arrays.size(), "ok"));
  expect_error(make_file(nested(65, R"({"a": )", "}"), {}), "JSON nested deeper than 64 levels");
  expect_error(make_file(nested(65, "[", "]"), {}), "JSON nested deeper than 64 levels");
  // 8 MB of unterminated {"a": (1.6 million levels): the error comes at level 65.
  std::string bomb = "{";
  while (bomb.size() < (8u << 20)) bomb += R"("a":{)";
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(make_file(bomb, {}), "JSON nested deeper than 64 levels");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// The tensors must cover the data section exactly (the reference implementation's rule).
TEST(Safetensors, TensorsCoverTheDataSectionExactly) {
  expect_error(make_file(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                         std::vector<uint8_t>(12)),
               "bytes [4, 8) of the data section belong to no tensor (before 'y' [8, 12])");
  expect_error(
      make_file(R"({"y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", std::vector<uint8_t>(8)),
      "bytes [0, 4) of the data section belong to no tensor");
  expect_error(
      make_file(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(6)),
      "bytes [4, 6) at the end of the data section (6 bytes after the header of");
  expect_error(make_file("{}", std::vector<uint8_t>(1)), "bytes [0, 1) at the end of the data section");
  // A zero-size tensor inside another one is an overlap; at a boundary it is fine.
  expect_error(make_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                         std::vector<uint8_t>(8)),
               "tensors 'x' [0, 8] and 'z' [4, 4] overlap");
  // A header length one byte short (the header ends in padding spaces, as HF writes it) still parses as
  // JSON, but would shift every tensor by one byte: refused.
  std::vector<uint8_t> file = make_file(kValidHeader + "  ", iota_bytes(40));
  EXPECT_TRUE(parses_or_errors(file.data(), file.size(), "ok.safetensors"));
  file[0] -= 1;
  expect_error(file, "bytes [40, 41) at the end of the data section");
}

TEST(Safetensors, EveryPrefixOfAValidFileParsesOrFailsCleanly) {
  const std::vector<uint8_t> file = make_file(kValidHeader, iota_bytes(40));
  EXPECT_TRUE(parses_or_errors(file.data(), file.size(), "v.safetensors"));
  for (size_t n = 0; n < file.size(); ++n) {
    const std::vector<uint8_t> prefix(file.begin(), file.begin() + (ptrdiff_t)n);
    EXPECT_FALSE(parses_or_errors(prefix.data(), prefix.size(), "v.safetensors")) << "prefix " << n;
  }
}

// Inputs the fuzzer once found interesting: each must parse or fail with ultra::Error.
TEST(Safetensors, FuzzRegressionInputs) {
  ASSERT_TRUE(fs::is_directory(kFuzzFixtures)) << kFuzzFixtures << " not found";
  int n = 0;
  for (const auto& e : fs::directory_iterator(kFuzzFixtures)) {
    const std::vector<uint8_t> bytes = read_bytes(e.path().string());
    parses_or_errors(bytes.data(), bytes.size(), e.path().string());
    ++n;
  }
  EXPECT_GT(n, 0);
}
