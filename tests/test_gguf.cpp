#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "alloc_counter.h"
#include "core/error.h"
#include "io/gguf.h"
#include "tmp_dir.h"

using namespace ultra;
using namespace ultra::gguf;
namespace fs = std::filesystem;

namespace {

const char* kVocabDir = "../shared/data/vocab";
const std::string kFuzzFixtures = std::string(ULTRA_SOURCE_DIR) + "/tests/fixtures/fuzz/gguf";

// Unique directory per test (tmp_dir.h), named for this suite.
struct TmpDir : ultra::test::TmpDir {
  TmpDir() : ultra::test::TmpDir("ultra_gguf") {}
  std::string path() const { return ultra::test::TmpDir::path().string(); }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Hand-made GGUF bytes, to build files the writer refuses to produce.
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).u32((uint32_t)ValueType::U32).u32(v); }
  Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, GgmlType type, uint64_t offset) {
    str(name).u32((uint32_t)ne.size());
    for (uint64_t d : ne) u64(d);
    return u32((uint32_t)type).u64(offset);
  }
  Bytes& pad(size_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// Parsing must throw ultra::Error whose message starts with the file name and contains `phrase`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& phrase) {
  try {
    Reader::parse(bytes.data(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << "parsed without error; expected: " << phrase;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos)
        << "message: " << msg << "\nexpected to contain: " << phrase;
  }
}

// Parses, accepting success or ultra::Error; anything else (another exception, a crash) fails the test.
// On success, calls every typed getter on every key as the fuzzer does: each returns or throws ultra::Error.
bool parses_or_errors(const uint8_t* data, size_t size, const std::string& name) {
  std::optional<Reader> r;
  try {
    r.emplace(Reader::parse(data, size, name));
  } catch (const Error&) {
    return false;
  }
  auto returns_or_errors = [](auto fn) {
    try {
      fn();
    } catch (const Error&) {
    }
  };
  for (const auto& kv : r->metadata()) {
    const std::string& key = kv.first;
    const Value& v = kv.second;
    returns_or_errors([&] { r->get_uint(key); });
    returns_or_errors([&] { r->get_float(key); });
    returns_or_errors([&] { r->get_string(key); });
    returns_or_errors([&] { r->get_bool_opt(key); });
    returns_or_errors([&] { v.as_int(); });
    returns_or_errors([&] { v.as_uint(); });
    returns_or_errors([&] { v.as_float(); });
    returns_or_errors([&] { v.as_bool(); });
  }
  return true;
}

// Compares by type and the field that type uses.
void expect_same_value(const Value& a, const Value& b, const std::string& ctx) {
  ASSERT_EQ(a.type, b.type) << ctx;
  switch (a.type) {
    case ValueType::STRING:
      EXPECT_EQ(a.s, b.s) << ctx;
      break;
    case ValueType::F32:
    case ValueType::F64:
      EXPECT_EQ(a.f, b.f) << ctx;
      break;
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      EXPECT_EQ(a.i, b.i) << ctx;
      break;
    case ValueType::ARRAY: {
      const Array& x = a.as_array();
      const Array& y = b.as_array();
      ASSERT_EQ(x.elem_type, y.elem_type) << ctx;
      ASSERT_EQ(x.size(), y.size()) << ctx;
      for (size_t k = 0; k < x.size(); ++k) {
        expect_same_value(x.at(k), y.at(k), ctx + "[" + std::to_string(k) + "]");
      }
      break;
    }
    default:
      EXPECT_EQ(a.u, b.u) << ctx;
  }
}

struct TestTensors {
  std::vector<float> f32 = std::vector<float>(4 * 3);
  std::vector<uint16_t> f16 = std::vector<uint16_t>(8);
  std::vector<BlockQ8_0> q8 = std::vector<BlockQ8_0>(4);  // ne = [64, 2]: 2 blocks per row

  TestTensors() {
    for (size_t k = 0; k < f32.size(); ++k) f32[k] = 0.5f * (float)k - 1;
    for (size_t k = 0; k < f16.size(); ++k) f16[k] = fp32_to_fp16((float)k / 4);
    for (size_t b = 0; b < q8.size(); ++b) {
      q8[b].d = fp32_to_fp16(0.01f * (float)(b + 1));
      for (int k = 0; k < kQ8_0Block; ++k) q8[b].qs[k] = (int8_t)(k - 16 + (int)b);
    }
  }
  void add_to(Writer& w) const {
    w.add_tensor("f32", GgmlType::F32, {4, 3}, f32.data(), f32.size() * 4);
    w.add_tensor("f16", GgmlType::F16, {8}, f16.data(), f16.size() * 2);
    w.add_tensor("blk.0.q8", GgmlType::Q8_0, {64, 2}, q8.data(), q8.size() * sizeof(BlockQ8_0));
  }
};

// A small valid file with a few key/values, an array and two tensors.
std::vector<uint8_t> small_valid_file(const TmpDir& dir) {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.context_length", 2048);
  w.set_array_string("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b"});
  w.set_value("nested",
              Value::of_array(ValueType::ARRAY,
                              {Value::of_array(ValueType::I32, {Value::of_int(ValueType::I32, 1)})}));
  const std::vector<float> a(8, 1.0f);
  const std::vector<uint16_t> h(4, 0x3c00);
  w.add_tensor("a", GgmlType::F32, {8}, a.data(), 32);
  w.add_tensor("h", GgmlType::F16, {2, 2}, h.data(), 8);
  const std::string path = dir.file("small.gguf");
  w.write(path);
  return read_bytes(path);
}

std::vector<fs::path> vocab_files() {
  std::vector<fs::path> files;
  if (!fs::is_directory(kVocabDir)) return files;
  for (const auto& e : fs::directory_iterator(kVocabDir)) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(Gguf, RoundTripEveryValueTypeAndTensors) {
  TmpDir dir;
  const TestTensors tensors;
  for (uint64_t alignment : {32, 64}) {
    SCOPED_TRACE(alignment);
    Writer w;
    w.set_u32("u32", 4000000000u);
    w.set_i32("i32", -7);
    w.set_u64("u64", 1ull << 60);
    w.set_f32("f32", 0.25f);
    w.set_bool("bool", true);
    w.set_string("string", "héllo\nworld");
    w.set_string("empty", "");
    w.set_array_string("arr.str", {"a", "", "ccc"});
    w.set_array_f32("arr.f32", {1.5f, -2.0f});
    w.set_array_i32("arr.i32", {-1, 0, 2147483647});
    w.set_value("u8", Value::of_uint(ValueType::U8, 255));
    w.set_value("i8", Value::of_int(ValueType::I8, -128));
    w.set_value("u16", Value::of_uint(ValueType::U16, 65535));
    w.set_value("i16", Value::of_int(ValueType::I16, -32768));
    w.set_value("i64", Value::of_int(ValueType::I64, std::numeric_limits<int64_t>::min()));
    w.set_value("f64", Value::of_float(ValueType::F64, 1e300));
    w.set_value("arr.empty", Value::of_array(ValueType::U64, {}));
    w.set_value("arr.bool", Value::of_array(ValueType::BOOL, {Value::of_bool(true), Value::of_bool(false)}));
    w.set_value(
        "arr.nested",
        Value::of_array(ValueType::ARRAY,
                        {Value::of_array(ValueType::I16, {Value::of_int(ValueType::I16, -3)}),
                         Value::of_array(ValueType::STRING, {Value::of_string("x"), Value::of_string("yz")}),
                         Value::of_array(ValueType::ARRAY, {Value::of_array(ValueType::U8, {})})}));
    w.set_u32("replaced", 1);
    w.set_u32("replaced", 2);  // replaces in place: stays before "last"
    w.set_string("last", "end");
    tensors.add_to(w);
    const std::string path = dir.file("rt.gguf");
    w.write(path, alignment);
    EXPECT_FALSE(fs::exists(path + ".tmp"));

    const std::vector<uint8_t> bytes = read_bytes(path);
    const Reader r = Reader::parse(bytes.data(), bytes.size(), path);
    EXPECT_EQ(r.version(), 3u);
    EXPECT_EQ(r.alignment(), alignment);
    EXPECT_EQ(r.path(), path);

    // Key order is insertion order; general.alignment is appended when not the default.
    std::vector<std::string> keys;
    for (const auto& [k, v] : r.metadata()) keys.push_back(k);
    std::vector<std::string> expected = {
        "u32",     "i32",     "u64",       "f32",      "bool",       "string",   "empty",
        "arr.str", "arr.f32", "arr.i32",   "u8",       "i8",         "u16",      "i16",
        "i64",     "f64",     "arr.empty", "arr.bool", "arr.nested", "replaced", "last"};
    if (alignment != 32) expected.push_back("general.alignment");
    EXPECT_EQ(keys, expected);

    EXPECT_EQ(r.get_uint("u32"), 4000000000u);
    EXPECT_EQ(r.find("i32")->as_int(), -7);
    EXPECT_EQ(r.get_uint("u64"), 1ull << 60);
    EXPECT_EQ(r.get_float("f32"), 0.25);
    EXPECT_EQ(r.get_bool_opt("bool"), true);
    EXPECT_EQ(r.get_string("string"), "héllo\nworld");
    EXPECT_EQ(r.get_string("empty"), "");
    EXPECT_EQ(r.get_uint("u8"), 255u);
    EXPECT_EQ(r.find("i8")->as_int(), -128);
    EXPECT_EQ(r.get_uint("u16"), 65535u);
    EXPECT_EQ(r.find("i16")->as_int(), -32768);
    EXPECT_EQ(r.find("i64")->as_int(), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(r.get_float("f64"), 1e300);
    EXPECT_EQ(r.get_uint("replaced"), 2u);

    const Array& strs = r.find("arr.str")->as_array();
    ASSERT_EQ(strs.elem_type, ValueType::STRING);
    ASSERT_EQ(strs.size(), 3u);
    EXPECT_EQ(strs.string_at(1), "");
    EXPECT_EQ(strs.string_at(2), "ccc");
    EXPECT_EQ(strs.at(2).as_string(), "ccc");
    const Array& f32s = r.find("arr.f32")->as_array();
    ASSERT_EQ(f32s.size(), 2u);
    EXPECT_EQ(f32s.float_at(1), -2.0);
    EXPECT_EQ(f32s.at(1).type, ValueType::F32);
    const Array& i32s = r.find("arr.i32")->as_array();
    ASSERT_EQ(i32s.size(), 3u);
    EXPECT_EQ(i32s.int_at(0), -1);
    EXPECT_EQ(i32s.int_at(2), 2147483647);
    EXPECT_EQ(i32s.at(2).type, ValueType::I32);
    EXPECT_THROW(i32s.uint_at(0), Error);  // negative
    EXPECT_THROW(i32s.string_at(0), Error);
    EXPECT_THROW(i32s.at(3), Error);
    const Array& bools = r.find("arr.bool")->as_array();
    ASSERT_EQ(bools.size(), 2u);
    EXPECT_TRUE(bools.at(0).as_bool());
    EXPECT_FALSE(bools.at(1).as_bool());
    EXPECT_TRUE(r.find("arr.empty")->as_array().empty());
    EXPECT_EQ(r.find("arr.empty")->as_array().elem_type, ValueType::U64);
    const Array& nested = r.find("arr.nested")->as_array();
    ASSERT_EQ(nested.elem_type, ValueType::ARRAY);
    ASSERT_EQ(nested.size(), 3u);
    EXPECT_EQ(nested.array_at(0).as_array().int_at(0), -3);
    EXPECT_EQ(nested.array_at(1).as_array().string_at(1), "yz");
    EXPECT_EQ(nested.array_at(2).as_array().array_at(0).as_array().elem_type, ValueType::U8);

    ASSERT_EQ(r.tensors().size(), 3u);
    const TensorInfo* f32 = r.find_tensor("f32");
    const TensorInfo* f16 = r.find_tensor("f16");
    const TensorInfo* q8 = r.find_tensor("blk.0.q8");
    ASSERT_TRUE(f32 && f16 && q8);
    EXPECT_EQ(r.find_tensor("missing"), nullptr);
    EXPECT_EQ(f32->ne, (std::vector<uint64_t>{4, 3}));
    EXPECT_EQ(f32->type, GgmlType::F32);
    EXPECT_EQ(f32->n_elements, 12u);
    EXPECT_EQ(f32->n_bytes, 48u);
    EXPECT_EQ(f16->type, GgmlType::F16);
    EXPECT_EQ(f16->n_bytes, 16u);
    EXPECT_EQ(q8->type, GgmlType::Q8_0);
    EXPECT_EQ(q8->ne, (std::vector<uint64_t>{64, 2}));
    EXPECT_EQ(q8->n_bytes, 4 * sizeof(BlockQ8_0));
    for (const TensorInfo* t : {f32, f16, q8}) {
      EXPECT_EQ(t->offset % alignment, 0u) << t->name;
      EXPECT_EQ((uint64_t)(t->data - bytes.data()) % alignment, 0u) << t->name;
    }
    EXPECT_EQ(std::memcmp(f32->data, tensors.f32.data(), 48), 0);
    EXPECT_EQ(std::memcmp(f16->data, tensors.f16.data(), 16), 0);
    EXPECT_EQ(std::memcmp(q8->data, tensors.q8.data(), q8->n_bytes), 0);

    // open() over the mapped file sees the same.
    const Reader m = Reader::open(path);
    ASSERT_EQ(m.tensors().size(), 3u);
    EXPECT_EQ(std::memcmp(m.find_tensor("blk.0.q8")->data, tensors.q8.data(), q8->n_bytes), 0);
    for (size_t k = 0; k < r.metadata().size(); ++k) {
      expect_same_value(r.metadata()[k].second, m.metadata()[k].second, r.metadata()[k].first);
    }
  }
}

TEST(Gguf, TypedGetters) {
  TmpDir dir;
  Writer w;
  w.set_i32("pos", 5);
  w.set_i32("neg", -5);
  w.set_f32("f", 1.5f);
  w.set_string("s", "x");
  w.set_bool("b", false);
  w.set_value("u8", Value::of_uint(ValueType::U8, 7));
  w.write(dir.file("g.gguf"));
  const Reader r = Reader::open(dir.file("g.gguf"));

  EXPECT_EQ(r.get_uint("pos"), 5u);  // signed but non-negative
  EXPECT_EQ(r.get_uint("u8"), 7u);
  EXPECT_EQ(r.get_float("pos"), 5.0);  // ints are floats too
  EXPECT_EQ(r.get_float("f"), 1.5);
  EXPECT_EQ(r.get_bool_opt("b"), false);
  EXPECT_EQ(r.get_uint_opt("absent"), std::nullopt);
  EXPECT_EQ(r.get_string_opt("absent"), std::nullopt);
  EXPECT_EQ(r.get_float_opt("absent"), std::nullopt);
  EXPECT_EQ(r.get_bool_opt("absent"), std::nullopt);

  auto expect_msg = [](auto fn, const std::string& phrase) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected " << phrase;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { r.get_uint("neg"); }, "key 'neg' is -5");
  expect_msg([&] { r.get_uint("f"); }, "key 'f' has type f32, expected an unsigned integer");
  expect_msg([&] { r.get_string("pos"); }, "key 'pos' has type i32, expected string");
  expect_msg([&] { r.get_string("absent"); }, "g.gguf: key 'absent' missing");
  expect_msg([&] { r.get_uint("absent"); }, "key 'absent' missing");
  expect_msg([&] { r.get_float("s"); }, "key 's' has type string, expected a float");
  expect_msg([&] { r.get_float_opt("s"); }, "expected a float");
  expect_msg([&] { r.get_bool_opt("pos"); }, "expected bool");
  expect_msg([&] { r.find("s")->as_int(); }, "has type string");
  EXPECT_EQ(r.find("f")->as_int(), 1);
  EXPECT_EQ(r.find("f")->as_uint(), 1u);
  EXPECT_EQ(r.find("neg")->as_float(), -5.0);
  EXPECT_TRUE(r.find("pos")->as_bool());
  // Floats outside the integer range (or NaN) are errors, not undefined behaviour.
  expect_msg([] { Value::of_float(ValueType::F64, 1e300).as_int(); }, "does not fit in i64");
  expect_msg([] { Value::of_float(ValueType::F64, -1.0).as_uint(); }, "does not fit in u64");
  expect_msg([] { Value::of_float(ValueType::F32, std::nan("")).as_uint(); }, "does not fit in u64");
  expect_msg([] { Value::of_uint(ValueType::U64, ~0ull).as_int(); }, "does not fit in i64");
  expect_msg([] { Value::of_int(ValueType::I32, -1).as_uint(); }, "is negative");
  expect_msg([&] { r.find("pos")->as_string(); }, "expected string");
  expect_msg([&] { r.find("pos")->as_array(); }, "expected array");
}

TEST(Gguf, WriterStreamsTensorsFromAProducer) {
  TmpDir dir;
  Writer w;
  w.add_tensor("p", GgmlType::F32, {3, 2}, [](uint8_t* dst) {
    for (int k = 0; k < 6; ++k) {
      const float v = (float)k;
      std::memcpy(dst + 4 * k, &v, 4);
    }
  });
  w.write(dir.file("p.gguf"));
  const Reader r = Reader::open(dir.file("p.gguf"));
  const TensorInfo* t = r.find_tensor("p");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->n_bytes, 24u);
  float v[6];
  std::memcpy(v, t->data, 24);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(v[k], (float)k);
}

TEST(Gguf, WriterRejectsInvalidInput) {
  TmpDir dir;
  const float data[64] = {};
  auto expect_msg = [](auto fn, const std::string& phrase) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected " << phrase;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  Writer w;
  expect_msg([&] { w.add_tensor("a", GgmlType::F32, {4}, data, 12); },
             "12 bytes given but shape [4] of type F32 needs 16");
  expect_msg([&] { w.add_tensor("a", GgmlType::Q8_0, {16}, data, 17); },
             "not a multiple of the Q8_0 block size 32");
  expect_msg([&] { w.add_tensor("a", GgmlType::F32, {}, data, 0); }, "has 0 dims");
  expect_msg([&] { w.add_tensor("a", (GgmlType)77, {4}, data, 16); }, "unknown tensor type id 77");
  w.add_tensor("a", GgmlType::F32, {4}, data, 16);
  expect_msg([&] { w.add_tensor("a", GgmlType::F32, {4}, data, 16); }, "duplicate tensor 'a'");
  expect_msg([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {4}, data, 16); },
             "is 64 bytes, more than llama.cpp's limit of 63");
  EXPECT_NO_THROW(w.add_tensor(std::string(63, 'n'), GgmlType::F32, {4}, data, 16));
  expect_msg([&] { w.write(dir.file("x.gguf"), 48); }, "alignment 48 is not a power of two");
  expect_msg([&] { w.write(dir.file("no/such/dir/x.gguf")); },
             "directory " + dir.file("no/such/dir") + " does not exist");
  expect_msg(
      [&] {
        Value::of_array(ValueType::U8, {Value::of_uint(ValueType::U8, 1), Value::of_string("x")});
      },
      "array of u8 holds a string element");
  // A failed write leaves nothing behind, neither the file nor a temporary one.
  Writer bad;
  bad.add_tensor("p", GgmlType::F32, {4}, [](uint8_t*) { throw Error("producer failed"); });
  expect_msg([&] { bad.write(dir.file("bad.gguf")); }, "producer failed");
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// The temporary file lives in the destination's directory under a unique name, and nothing but the result
// is left there; an existing regular file is replaced, anything else at the destination is refused.
TEST(Gguf, WriterTemporaryFile) {
  TmpDir dir;
  const std::string out = dir.file("out.gguf");
  std::vector<std::string> seen;
  Writer w;
  w.add_tensor("p", GgmlType::F32, {4}, [&](uint8_t*) {
    for (const auto& e : fs::directory_iterator(dir.path())) seen.push_back(e.path().filename().string());
  });
  std::ofstream(out) << "old";
  w.write(out);
  ASSERT_EQ(seen.size(), 2u);  // the old file and the temporary one
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen[0].rfind(".out.gguf.tmp.", 0), 0u) << seen[0];
  EXPECT_EQ(seen[1], "out.gguf");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  EXPECT_EQ(Reader::open(out).tensors().size(), 1u);
  // Not a regular file: refused before anything is created.
  fs::create_directory(dir.file("d"));
  fs::create_symlink(out, dir.file("link.gguf"));
  auto refuses = [&](const std::string& path, const std::string& phrase) {
    try {
      w.write(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  refuses(dir.file("d"), "output exists and is a directory; refusing to replace it");
  refuses(dir.file("link.gguf"), "output exists and is a symbolic link; refusing to replace it");
  EXPECT_TRUE(fs::is_symlink(dir.file("link.gguf")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 3);
}

TEST(Gguf, ReadsRealVocabFiles) {
  const auto files = vocab_files();
  if (files.empty()) GTEST_SKIP() << kVocabDir << " not found";
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const Reader r = Reader::open(path.string());
    EXPECT_TRUE(r.version() == 2 || r.version() == 3);
    EXPECT_FALSE(r.get_string("tokenizer.ggml.model").empty());
    EXPECT_FALSE(r.get_string("general.architecture").empty());
    const Value* tokens = r.find("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens);
    const Array& arr = tokens->as_array();
    EXPECT_EQ(arr.elem_type, ValueType::STRING);
    EXPECT_GT(arr.size(), 1000u);
    for (size_t k = 0; k < arr.size(); ++k) ASSERT_EQ(arr.at(k).type, ValueType::STRING);
    if (const Value* types = r.find("tokenizer.ggml.token_type")) {
      EXPECT_EQ(types->as_array().size(), arr.size());
    }
  }
}

// Every key/value of a real file written back by the writer and read again compares equal.
TEST(Gguf, RewritesRealVocabFile) {
  const auto files = vocab_files();
  if (files.empty()) GTEST_SKIP() << kVocabDir << " not found";
  TmpDir dir;
  const Reader r = Reader::open(files.front().string());
  Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  w.write(dir.file("copy.gguf"), r.alignment());
  const Reader c = Reader::open(dir.file("copy.gguf"));
  ASSERT_EQ(c.metadata().size(), r.metadata().size());
  for (size_t k = 0; k < r.metadata().size(); ++k) {
    EXPECT_EQ(c.metadata()[k].first, r.metadata()[k].first);
    expect_same_value(c.metadata()[k].second, r.metadata()[k].second, r.metadata()[k].first);
  }
}

// Cutting a file anywhere before the end of its last tensor's data must fail cleanly (only the trailing
// zero padding may be cut off).
TEST(Gguf, EveryPrefixOfAValidFileParsesOrFailsCleanly) {
  TmpDir dir;
  const std::vector<uint8_t> file = small_valid_file(dir);
  const Reader full = Reader::parse(file.data(), file.size(), "small.gguf");
  size_t data_end = 0;
  for (const auto& t : full.tensors())
    data_end = std::max(data_end, (size_t)(t.data - file.data() + t.n_bytes));
  ASSERT_LT(data_end, file.size());
  for (size_t n = 0; n < file.size(); ++n) {
    // Copy so that reading past the prefix is caught by ASan builds.
    const std::vector<uint8_t> prefix(file.begin(), file.begin() + (ptrdiff_t)n);
    EXPECT_EQ(parses_or_errors(prefix.data(), prefix.size(), "small.gguf"), n >= data_end) << "prefix " << n;
  }
}

TEST(Gguf, PrefixesOfARealFileParseOrFailCleanly) {
  const auto files = vocab_files();
  if (files.empty()) GTEST_SKIP() << kVocabDir << " not found";
  const std::vector<uint8_t> file = read_bytes(files.front().string());
  for (size_t n = 0; n < file.size(); n += file.size() / 97 + 1) {
    const std::vector<uint8_t> prefix(file.begin(), file.begin() + (ptrdiff_t)n);
    EXPECT_FALSE(parses_or_errors(prefix.data(), prefix.size(), "vocab.gguf")) << "prefix " << n;
  }
}

TEST(Gguf, RejectsBadHeaders) {
  expect_error({}, "too short for the magic");
  expect_error(Bytes().u32(0x4c4d4747).u32(3).u64(0).u64(0).b, "bad magic");
  expect_error(Bytes().header(1, 0, 0).b, "unsupported GGUF version 1");
  expect_error(Bytes().header(4, 0, 0).b, "unsupported GGUF version 4");
  expect_error(Bytes().header(0x03000000, 0, 0).b, "big-endian");
  expect_error(Bytes().u32(0x46554747).u32(3).u64(0).b, "truncated: key/value count");
  expect_error(Bytes().header(3, 0, 1ull << 63).b, "claims 9223372036854775808 key/value pairs");
  expect_error(Bytes().header(3, 1ull << 63, 0).b, "claims 9223372036854775808 tensor infos");
  expect_error(Bytes().header(3, 0, 2).kv_u32("a", 1).str("bbbbbbbb").u32(4).b,
               "truncated: value of key 'bbbbbbbb'");
}

TEST(Gguf, RejectsBadKeyValues) {
  expect_error(Bytes().header(3, 0, 1).u64(1ull << 62).zeros(16).b,
               "key #0 at offset 24 has length 4611686018427387904");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(13).zeros(8).b,
               "key 'k' at offset 24 has unknown value type 13");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(8).u64(1000).zeros(8).b, "has length 1000");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(9).u32(77).u64(0).b, "array of unknown value type 77");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(9).u32(8).u64(1ull << 60).zeros(16).b,
               "claims 1152921504606846976 string elements");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(7).u8(2).b, "bool with invalid value 2");
  expect_error(Bytes().header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "duplicate key 'k'");
  Bytes deep;
  deep.header(3, 0, 1).str("deep").u32(9);
  for (int k = 0; k < 40; ++k) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  expect_error(deep.b, "nested deeper than 16 levels");
  expect_error(Bytes().header(3, 0, 1).str("k").u32(9).u32(7).u64(3).u8(1).u8(0).u8(2).b,
               "value of key 'k' at offset 51 is a bool with invalid value 2");
}

// Counts whose per-entry memory is a few hundred bytes are limited (Reader::kMax*).
TEST(Gguf, RejectsCountsAboveTheLimits) {
  Bytes kvs;
  kvs.header(3, 0, Reader::kMaxKeyValues + 1);
  for (uint64_t k = 0; k <= Reader::kMaxKeyValues; ++k) kvs.str("").u32((uint32_t)ValueType::U8).u8(0);
  expect_error(kvs.b, "header claims 65537 key/value pairs, more than the limit of 65536");
  expect_error(Bytes().header(3, Reader::kMaxTensors + 1, 0).zeros(32 * (Reader::kMaxTensors + 1)).b,
               "header claims 262145 tensors, more than the limit of 262144");
  Bytes nested;
  nested.header(3, 0, 1).str("k").u32((uint32_t)ValueType::ARRAY).u32((uint32_t)ValueType::ARRAY);
  nested.u64(Reader::kMaxNestedArrays + 1);
  for (uint64_t k = 0; k <= Reader::kMaxNestedArrays; ++k) nested.u32((uint32_t)ValueType::U8).u64(0);
  expect_error(nested.b, "arrays of arrays hold more than 65536 elements in this file");
}

// Memory is proportional to the bytes of the file, not to element counts: a number array is a view of
// the file, a string array 16 bytes per element (each element takes at least 8 bytes of file).
TEST(Gguf, ArrayMemoryIsBoundedByTheFile) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#else
  const uint64_t n = 4u << 20;
  Bytes u8s;
  u8s.header(3, 0, 1).str("u8s").u32((uint32_t)ValueType::ARRAY).u32((uint32_t)ValueType::U8).u64(n).zeros(n);
  {
    AllocCount count;
    const Reader r = Reader::parse(u8s.b.data(), u8s.b.size(), "u8s.gguf");
    count.stop();
    EXPECT_LT(count.bytes(), 64u << 10);  // was ~88 bytes per element: 370 MB
    const Array& a = r.find("u8s")->as_array();
    ASSERT_EQ(a.size(), n);
    EXPECT_EQ(a.uint_at(n - 1), 0u);
    EXPECT_EQ(a.raw(), u8s.b.data() + 24 + 8 + 3 + 4 + 4 + 8);
  }
  const uint64_t m = 1u << 20;
  Bytes strs;
  strs.header(3, 0, 1).str("s").u32((uint32_t)ValueType::ARRAY).u32((uint32_t)ValueType::STRING).u64(m);
  for (uint64_t k = 0; k < m; ++k) strs.str("");
  {
    AllocCount count;
    const Reader r = Reader::parse(strs.b.data(), strs.b.size(), "strs.gguf");
    count.stop();
    EXPECT_GT(count.bytes(), 0u) << "the allocation counter does not count";
    EXPECT_LE(count.bytes(), 16 * m + (64u << 10));
    EXPECT_EQ(r.find("s")->as_array().size(), m);
  }
#endif
}

TEST(Gguf, RejectsOverlappingTensors) {
  expect_error(Bytes()
                   .header(3, 2, 0)
                   .tensor("a", {16}, GgmlType::F32, 0)
                   .tensor("b", {8}, GgmlType::F32, 32)
                   .pad(32)
                   .zeros(64)
                   .b,
               "tensors 'a' [offset 0, 64 bytes] and 'b' [offset 32, 32 bytes] overlap");
  // Adjacent tensors, and gaps between them, are fine.
  const std::vector<uint8_t> ok = Bytes()
                                      .header(3, 2, 0)
                                      .tensor("a", {8}, GgmlType::F32, 64)
                                      .tensor("b", {8}, GgmlType::F32, 0)
                                      .pad(32)
                                      .zeros(128)
                                      .b;
  EXPECT_NO_THROW(Reader::parse(ok.data(), ok.size(), "ok.gguf"));
}

TEST(Gguf, RejectsBadAlignment) {
  expect_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 0).b,
               "must be a non-zero power of two, got 0");
  expect_error(Bytes().header(3, 0, 1).kv_u32("general.alignment", 3).b,
               "must be a non-zero power of two, got 3");
  expect_error(Bytes().header(3, 0, 1).str("general.alignment").u32(10).u64(64).b,
               "key 'general.alignment' has type u64, expected u32");
  // The alignment applies to tensor offsets: 32 is fine by default but not with alignment 64.
  auto with_alignment = [](uint32_t a) {
    return Bytes()
        .header(3, 1, 1)
        .kv_u32("general.alignment", a)
        .tensor("t", {8}, GgmlType::F32, 32)
        .pad(a)
        .zeros(64);
  };
  const Bytes ok = with_alignment(32);
  EXPECT_NO_THROW(Reader::parse(ok.b.data(), ok.b.size(), "ok.gguf"));
  expect_error(with_alignment(64).b, "tensor 't' offset 32 is not a multiple of the alignment 64");
}

TEST(Gguf, RejectsBadTensorInfos) {
  auto one = [](std::vector<uint64_t> ne, GgmlType type, uint64_t offset, size_t data_bytes) {
    return Bytes().header(3, 1, 0).tensor("blk.0.w", ne, type, offset).pad(32).zeros(data_bytes).b;
  };
  const std::vector<uint8_t> ok = one({4, 2}, GgmlType::F32, 0, 32);
  EXPECT_NO_THROW(Reader::parse(ok.data(), ok.size(), "ok.gguf"));
  expect_error(one({4, 2}, (GgmlType)99, 0, 32), "tensor 'blk.0.w' has unknown tensor type id 99");
  expect_error(one({4, 0}, GgmlType::F32, 0, 32), "tensor 'blk.0.w' has ne[1] = 0");
  expect_error(one({1, 1, 1, 1, 1}, GgmlType::F32, 0, 32), "has 5 dims, expected 1 to 4");
  expect_error(one({}, GgmlType::F32, 0, 32), "has 0 dims, expected 1 to 4");
  expect_error(one({1ull << 40, 1ull << 40}, GgmlType::F32, 0, 32),
               "element count of shape [1099511627776, 1099511627776] overflows");
  expect_error(one({1ull << 62}, GgmlType::F32, 0, 32),
               "byte size of shape [4611686018427387904] of type F32 overflows");
  expect_error(one({33}, GgmlType::Q8_0, 0, 64),
               "row length ne[0] = 33 is not a multiple of the Q8_0 block size 32");
  expect_error(one({384, 2}, GgmlType::Q4_K, 0, 2 * 144 * 2),
               "row length ne[0] = 384 is not a multiple of the Q4_K block size 256");
  const std::vector<uint8_t> iq4nl = one({64, 2}, GgmlType::IQ4_NL, 0, 4 * 18);  // id 20: known, 18 B / 32
  EXPECT_NO_THROW(Reader::parse(iq4nl.data(), iq4nl.size(), "iq4nl.gguf"));
  expect_error(one({256, 2}, GgmlType::Q6_K, 0, 2 * 210 - 1), "lies outside the file");
  expect_error(one({4}, GgmlType::F32, 8, 32),
               "tensor 'blk.0.w' offset 8 is not a multiple of the alignment 32");
  expect_error(one({4, 2}, GgmlType::F32, 0, 31),
               "tensor 'blk.0.w' data [offset 0, 32 bytes] lies outside the file");
  expect_error(one({4}, GgmlType::F32, 1ull << 63, 32), "lies outside the file");
  expect_error(one({4}, GgmlType::F32, ~31ull, 32), "lies outside the file");
  expect_error(Bytes().header(3, 1, 0).str("tensor_name_long").u32(1).u64(4).u32(0).b,
               "truncated: tensor 'tensor_name_long'");
  expect_error(Bytes()
                   .header(3, 2, 0)
                   .tensor("dup", {4}, GgmlType::F32, 0)
                   .tensor("dup", {4}, GgmlType::F32, 32)
                   .pad(32)
                   .zeros(64)
                   .b,
               "duplicate tensor 'dup'");
}

// Inputs the fuzzer once found interesting: each must parse or fail with ultra::Error.
TEST(Gguf, FuzzRegressionInputs) {
  ASSERT_TRUE(fs::is_directory(kFuzzFixtures)) << kFuzzFixtures << " not found";
  int n = 0;
  for (const auto& e : fs::directory_iterator(kFuzzFixtures)) {
    const std::vector<uint8_t> bytes = read_bytes(e.path().string());
    parses_or_errors(bytes.data(), bytes.size(), e.path().string());
    ++n;
  }
  EXPECT_GT(n, 0);
}
