// The `ultra` executable end to end: --json and --dump-logits against the HF fixtures, bench output,
// convert, and clear errors (non-zero exit, "error: ..." naming the problem) on bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sanitized.h"
#include "tmp_dir.h"

using nlohmann::json;
using ultra::test::TmpDir;
namespace fs = std::filesystem;

namespace {

const fs::path kHf = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";

struct Out {
  int code = -1;
  std::string out, err;
};

// Runs `ultra ARGS` (under `timeout`, so that a hang fails instead of blocking the suite), capturing stdout
// and stderr (to a temp file). A missing binary is a failure, not a skip.
Out ultra(const std::string& args) {
  Out o;
  if (!fs::is_regular_file(ULTRA_ULTRA_BIN)) {
    ADD_FAILURE() << "the ultra binary is missing: " << ULTRA_ULTRA_BIN;
    return o;
  }
  const TmpDir tmp("ultra_cli");
  const std::string err = tmp.file("stderr.txt");
  const std::string cmd = "timeout 60 " + std::string(ULTRA_ULTRA_BIN) + " " + args + " 2>" + err;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return o;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  const int st = pclose(p);
  o.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  EXPECT_NE(o.code, 124) << "timed out: ultra " << args;
  std::ifstream e(err);
  o.err.assign(std::istreambuf_iterator<char>(e), {});
  return o;
}

json reference(const std::string& name) {
  std::ifstream f(kHf / name / "reference.json");
  return json::parse(f);
}

std::string ids_arg(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

TEST(Cli, RunJsonGreedyMatchesHf) {
  const json ref = reference("qwen2_bias");
  const auto prompt = ref["prompt"].get<std::vector<int>>();
  const TmpDir tmp("ultra_cli");
  const fs::path dump = tmp.file("logits.bin");
  const Out o = ultra("run -m " + (kHf / "qwen2_bias").string() + " --prompt-ids " + ids_arg(prompt) +
                      " -n 32 --temp 0 --ignore-eos --json --dump-logits " + dump.string());
  ASSERT_EQ(o.code, 0) << o.err;
  const json j = json::parse(o.out);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), prompt);
  EXPECT_EQ(j["generated_ids"].get<std::vector<int>>(), ref["greedy"].get<std::vector<int>>());
  EXPECT_EQ(j["timings"]["prompt_tokens"].get<int>(), (int)prompt.size());
  EXPECT_EQ(j["timings"]["eval_tokens"].get<int>(), 31);
  EXPECT_GT(j["timings"]["eval_tps"].get<double>(), 0);

  // First dumped row = logits of the last prompt position, which HF's fixture has.
  const int V = ref["n_vocab"].get<int>();
  ASSERT_EQ(fs::file_size(dump), (uintmax_t)32 * V * 4);
  std::vector<float> got(V), want(V);
  std::ifstream(dump, std::ios::binary).read((char*)got.data(), V * 4);
  std::ifstream w(kHf / "qwen2_bias" / "logits_f32.bin", std::ios::binary);
  w.seekg((std::streamoff)(prompt.size() - 1) * V * 4);
  w.read((char*)want.data(), V * 4);
  double err = 0;
  for (int i = 0; i < V; ++i) err = std::max(err, (double)std::fabs(got[i] - want[i]));
  EXPECT_LT(err, 1e-4);
}

TEST(Cli, RunTextOutputHasTimings) {
  const Out o =
      ultra("run -m " + (kHf / "llama_gqa").string() + " --prompt-ids 1,2,3 -n 8 --temp 0.7 --seed 5");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("prompt eval time"), std::string::npos);
  EXPECT_NE(o.err.find("eval time"), std::string::npos);
  EXPECT_NE(o.err.find("KV cache"), std::string::npos);
  // Same seed -> same tokens.
  const Out o2 =
      ultra("run -m " + (kHf / "llama_gqa").string() + " --prompt-ids 1,2,3 -n 8 --temp 0.7 --seed 5");
  EXPECT_EQ(o.out, o2.out);
}

// --no-mmap reads the model into huge-page memory instead of mapping it: the same greedy tokens (the bundled
// GGUF, and an HF directory's safetensors).
TEST(Cli, NoMmapSameTokens) {
  for (const std::string m : {std::string(), " -m " + (kHf / "qwen2_bias").string()}) {
    const std::string args = "run" + m + " --prompt-ids 1,2,3,4 -n 12 --temp 0 --ignore-eos --json";
    const Out a = ultra(args), b = ultra(args + " --no-mmap");
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    const auto ga = json::parse(a.out)["generated_ids"].get<std::vector<int>>();
    EXPECT_EQ(ga.size(), 12u);
    EXPECT_EQ(json::parse(b.out)["generated_ids"].get<std::vector<int>>(), ga) << m;
  }
}

TEST(Cli, BenchTable) {
  const Out o = ultra("bench -m " + (kHf / "mistral").string() + " -p 16 -n 8 -r 2 -t 1");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("pp16"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("tg8"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("±"), std::string::npos) << o.out;
}

TEST(Cli, ConvertThenRun) {
  const TmpDir tmp("ultra_cli");
  const fs::path out = tmp.file("convert.gguf");
  const Out c =
      ultra("convert " + (kHf / "llama_tied_rope3").string() + " -o " + out.string() + " --outtype f16");
  ASSERT_EQ(c.code, 0) << c.err;
  const json ref = reference("llama_tied_rope3");
  const Out o = ultra("run -m " + out.string() + " --prompt-ids " +
                      ids_arg(ref["prompt"].get<std::vector<int>>()) + " -n 32 --temp 0 --ignore-eos --json");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(json::parse(o.out)["generated_ids"].get<std::vector<int>>(),
            ref["greedy_f16w"].get<std::vector<int>>());
}

void expect_error(const std::string& args, const std::string& phrase) {
  const Out o = ultra(args);
  EXPECT_NE(o.code, 0) << args;
  EXPECT_LT(o.code, 128) << "crashed: " << args;
  EXPECT_NE(o.err.find("error:"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find(phrase), std::string::npos) << "stderr: " << o.err;
}

TEST(Cli, BadInputGivesClearErrors) {
  const std::string m = (kHf / "llama_gqa").string();
  expect_error("run -m /nonexistent/model.gguf --prompt-ids 1", "/nonexistent/model.gguf");
  expect_error("run -m " + m + " --prompt-ids 1,99999", "out of range");
  expect_error("run -m " + m + " --prompt-ids 1,x,3", "invalid token id list");
  expect_error("run -m " + m + " --prompt-ids 1,2,3,4,5,6,7,8 -c 4", "does not fit");
  expect_error("run -m " + m + " --prompt-ids 1 --top-p 1.5", "--top-p");
  expect_error("run -m " + m, "no prompt");
  expect_error("run -m '' --prompt-ids 1", "-m: the model path is empty");
  expect_error("run -m " + m + " --prompt-ids 1 --mem-limit 12Q", "--mem-limit '12Q'");
  expect_error("run -m " + m + " --prompt-ids 1 --mem-limit 4K", "the limit (--mem-limit) is");
  const TmpDir tmp("ultra_cli");
  expect_error("convert " + m + " -o " + tmp.file("x.gguf") + " --outtype q4_9", "unknown output type");
  const Out o = ultra("frobnicate");
  EXPECT_EQ(o.code, 2);
  // A file that is not a model.
  const fs::path junk = tmp.file("junk.gguf");
  std::ofstream(junk) << "this is not a gguf file at all";
  expect_error("run -m " + junk.string() + " --prompt-ids 1", junk.string());
}

}  // namespace

namespace {

// Paths that are not regular files are refused before they are opened: a FIFO would block open() until
// a writer appears (forever), a directory read as a text file gives empty input.
// Speculative decoding from the command line: the bundled pair (--speculative) and -md with prompt
// lookup give plain greedy's tokens, and the timing block reports the rounds.
// ultra quantize: progress per tensor, a summary line, the file runs with ultra run; clear errors.
TEST(Cli, QuantizeThenRun) {
  const TmpDir tmp("ultra_cli");
  const std::string target = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();
  for (const char* type : {"fp8", "ternary", "tq2_0"}) {
    const std::string out = tmp.file(std::string("q-") + type + ".gguf");
    const Out q = ultra("quantize " + target + " " + out + " --type " + type);
    ASSERT_EQ(q.code, 0) << q.err;
    EXPECT_NE(q.err.find("blk.7.ffn_down.weight"), std::string::npos) << q.err;  // progress
    EXPECT_NE(q.err.find("wrote " + out), std::string::npos) << q.err;
    if (std::string(type) == "tq2_0") {  // 384-column rows fall back to Q8_0, with a warning
      EXPECT_NE(
          q.err.find("warning: blk.0.attn_q.weight: 384 columns are not a multiple of 256; written as Q8_0"),
          std::string::npos)
          << q.err;
    }
    const Out o = ultra("run -m " + out + " --prompt-ids 814,26 -n 8 --temp 0 --json");
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(json::parse(o.out)["generated_ids"].size(), 8u);
  }
  {  // a llama.cpp mix: a line per tensor with its types and sizes
    const std::string out = tmp.file("q-q4_k_m.gguf");
    const Out q = ultra("quantize " + target + " " + out + " --type q4_k_m -t 2");
    ASSERT_EQ(q.code, 0) << q.err;
    EXPECT_NE(q.err.find("blk.0.ffn_down.weight"), std::string::npos) << q.err;
    EXPECT_NE(q.err.find("[1024 x 384] F16 -> Q6_K"), std::string::npos) << q.err;
    EXPECT_NE(q.err.find("wrote " + out), std::string::npos) << q.err;
    // llama-quantize's order (IN OUT TYPE THREADS) writes the same file
    const std::string out2 = tmp.file("q-q4_k_m-2.gguf");
    const Out q2 = ultra("quantize " + target + " " + out2 + " q4_k_m 2");
    ASSERT_EQ(q2.code, 0) << q2.err;
    const auto bytes = [](const std::string& p) {
      std::ifstream f(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    EXPECT_TRUE(bytes(out2) == bytes(out)) << "the two orders wrote different files";
  }
  expect_error("quantize " + target + " " + tmp.file("x.gguf") + " q4_k_m --type q6_k",
               "the type is given twice: TYPE 'q4_k_m' and --type 'q6_k'");
  expect_error("quantize " + target + " " + tmp.file("x.gguf") + " q4_k_m 2 -t 1",
               "the thread count is given twice: THREADS 2 and --threads 1");
  expect_error(
      "quantize " + target + " " + tmp.file("x.gguf") + " --type q4_k_m --imatrix " + tmp.file("none.dat"),
      "none.dat: the imatrix file does not exist");
  expect_error("quantize " + target + " " + tmp.file("x.gguf") + " --type q4_q",
               "unknown output type 'q4_q'");
  expect_error("quantize " + tmp.file("missing.gguf") + " " + tmp.file("x.gguf") + " --type fp8",
               "no such file or directory");
  expect_error("quantize " + target + " " + target + " --type fp8", "refusing to overwrite");
  const Out h = ultra("quantize " + target + " " + tmp.file("x.gguf"));  // a type is required
  EXPECT_NE(h.code, 0);
  EXPECT_NE(h.err.find("--type"), std::string::npos) << h.err;
}

TEST(Cli, RunSpeculative) {
  const std::string plain = "run -p ROMEO: -n 40 --temp 0 --json";
  const Out ref = ultra(plain);
  ASSERT_EQ(ref.code, 0) << ref.err;
  const auto want = json::parse(ref.out)["generated_ids"].get<std::vector<int>>();
  const std::string draft = (fs::path(ULTRA_SOURCE_DIR) / "models" / "draft.gguf").string();
  for (const std::string& flags :
       std::vector<std::string>{"--speculative", "--speculative --draft-max 3 --draft-p-min 0.5",
                                "-md " + draft + " --lookup 2 --draft-max 6", "--lookup 1"}) {
    const Out o = ultra(plain + " " + flags);
    ASSERT_EQ(o.code, 0) << flags << ": " << o.err;
    const json j = json::parse(o.out);
    EXPECT_EQ(j["generated_ids"].get<std::vector<int>>(), want) << flags;
    EXPECT_GT(j["speculative"]["rounds"].get<int>(), 0) << flags;
  }
  const Out text = ultra("run -p ROMEO: -n 40 --temp 0.8 -s 3 --speculative");
  ASSERT_EQ(text.code, 0) << text.err;
  for (const char* needle : {"acceptance rate", "accepted per round", "tokens per target pass", "draft: "})
    EXPECT_NE(text.err.find(needle), std::string::npos) << needle << "\n" << text.err;
  const std::string m = (kHf / "llama_gqa").string();
  expect_error("run --speculative -p x --dump-logits /dev/null", "--dump-logits is not available");
  expect_error("run -p x --draft-max 4", "--draft-max needs a draft");
  expect_error("run -p x -md " + m, "its vocabulary has 320 tokens, the target's 4096");
  const Out k0 = ultra("run -p x --speculative --draft-max 0");  // the flag parser's own message
  EXPECT_NE(k0.code, 0);
  EXPECT_NE(k0.err.find("--draft-max: Value 0 not in range 1 to 64"), std::string::npos) << k0.err;
}

// --device cuda / llama.cpp's -ngl: on a machine without a GPU (CI) a clear error naming CUDA; with one, it
// runs. -ngl 0 is the CPU.
TEST(Cli, DeviceFlags) {
  const std::string m = (kHf / "llama_gqa").string();
  for (const char* flag : {"--device cuda", "-ngl 99"}) {
    const Out o = ultra(std::string("run -m ") + m + " --prompt-ids 1,2 -n 2 " + flag);
    EXPECT_LT(o.code, 128) << "crashed: " << flag;
    if (o.code != 0) {
      EXPECT_NE(o.err.find("CUDA"), std::string::npos) << o.err;
    }
  }
  const Out cpu = ultra("run -m " + m + " --prompt-ids 1,2 -n 2 -ngl 0");
  EXPECT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_NE(cpu.err.find("backend: CPU"), std::string::npos) << cpu.err;
  const Out tpu = ultra("run -m " + m + " --prompt-ids 1 --device tpu");  // the flag parser's own message
  EXPECT_NE(tpu.code, 0);
  EXPECT_NE(tpu.err.find("--device: tpu not in {cpu,cuda}"), std::string::npos) << tpu.err;
  expect_error("run -m " + m + " --prompt-ids 1 --kv-type bf16",
               "bf16 KV cache is supported on the CUDA backend only");
}

TEST(Cli, NonRegularFilesAreRefused) {
  const TmpDir tmp("ultra_cli");
  const std::string fifo = tmp.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string m = (kHf / "llama_gqa").string();
  const std::string vocab =
      (fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "vocab" / "ggml-vocab-gpt-2.gguf").string();
  expect_error("run -m " + fifo + " --prompt-ids 1", fifo + ": GGUF file is a FIFO, expected a regular file");
  expect_error("tokenize -m " + fifo + " hello", "is a FIFO");
  expect_error("tokenize -m " + vocab + " -f " + fifo, "is a FIFO");
  expect_error("tokenize -m " + vocab + " -f " + tmp.path().string(), "is a directory");
  expect_error("perplexity -m " + m + " -f " + fifo, "is a FIFO");
  expect_error("perplexity -m " + m + " -f " + tmp.path().string(), "is a directory");

  // An HF directory whose weights, or config, are a FIFO.
  const fs::path hf = tmp.path() / "hf";
  fs::create_directory(hf);
  fs::copy_file(kHf / "llama_gqa" / "config.json", hf / "config.json");
  ASSERT_EQ(mkfifo((hf / "model.safetensors").c_str(), 0600), 0);
  expect_error("run -m " + hf.string() + " --prompt-ids 1", "model.safetensors: safetensors file is a FIFO");
  fs::remove(hf / "config.json");
  ASSERT_EQ(mkfifo((hf / "config.json").c_str(), 0600), 0);
  expect_error("run -m " + hf.string() + " --prompt-ids 1", "config.json: config file is a FIFO");
}

}  // namespace

namespace {

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// `convert -o` refuses, before any work, an output that is not a new path or a regular file, or that is
// one of its inputs (by device and inode: hard links and shards included); nothing is left behind.
TEST(Cli, ConvertRefusesUnsafeOutputs) {
  const TmpDir tmp("ultra_cli");
  const fs::path hf = tmp.path() / "hf";
  fs::create_directory(hf);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kHf / "llama_gqa" / f, hf / f);
  const std::string weights = file_bytes(hf / "model.safetensors");
  const std::string conv = "convert " + hf.string() + " --outtype f32 -o ";

  expect_error(conv + (hf / "model.safetensors").string(), "the output is the input file");
  expect_error(conv + (hf / "config.json").string(), "the output is the input file");
  fs::create_hard_link(hf / "model.safetensors", tmp.path() / "hardlink.gguf");
  expect_error(conv + (tmp.path() / "hardlink.gguf").string(), "the output is the input file");
  std::ofstream(tmp.path() / "target.gguf") << "keep";
  fs::create_symlink(tmp.path() / "target.gguf", tmp.path() / "link.gguf");
  expect_error(conv + (tmp.path() / "link.gguf").string(), "output exists and is a symbolic link");
  expect_error(conv + tmp.path().string(), "output exists and is a directory");
  ASSERT_EQ(mkfifo((tmp.path() / "fifo").c_str(), 0600), 0);
  expect_error(conv + (tmp.path() / "fifo").string(), "output exists and is a FIFO");
  expect_error(conv + (tmp.path() / "no" / "x.gguf").string(), "does not exist");

  // A sharded checkpoint whose shard sits in a subdirectory: the shard is an input too.
  const fs::path sh = tmp.path() / "sharded";
  fs::create_directories(sh / "sub");
  fs::copy_file(hf / "config.json", sh / "config.json");
  fs::copy_file(hf / "model.safetensors", sh / "sub" / "part.safetensors");
  {
    const auto st = json::parse(file_bytes(hf / "model.safetensors").substr(8, [&] {
      uint64_t n;
      std::memcpy(&n, weights.data(), 8);
      return (size_t)n;
    }()));
    json map = json::object();
    for (const auto& [name, v] : st.items())
      if (name != "__metadata__") map[name] = "sub/part.safetensors";
    std::ofstream(sh / "model.safetensors.index.json") << json{{"weight_map", map}}.dump();
  }
  const std::string shard = file_bytes(sh / "sub" / "part.safetensors");
  expect_error("convert " + sh.string() + " -o " + (sh / "sub" / "part.safetensors").string(),
               "the output is the input file");

  // Inputs untouched, the link still a link, and no temporary files anywhere.
  EXPECT_EQ(file_bytes(hf / "model.safetensors"), weights);
  EXPECT_EQ(file_bytes(sh / "sub" / "part.safetensors"), shard);
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "link.gguf"));
  EXPECT_EQ(file_bytes(tmp.path() / "target.gguf"), "keep");
  EXPECT_EQ(listing(tmp.path()),
            (std::vector<std::string>{"fifo", "hardlink.gguf", "hf", "link.gguf", "sharded", "target.gguf"}));
  EXPECT_EQ(listing(hf), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(listing(sh / "sub"), (std::vector<std::string>{"part.safetensors"}));

  // A regular file is replaced (and the sharded checkpoint converts).
  const Out ok = ultra("convert " + sh.string() + " -o " + (tmp.path() / "target.gguf").string());
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(file_bytes(tmp.path() / "target.gguf").substr(0, 4), "GGUF");
  EXPECT_EQ(listing(tmp.path()).size(), 6u);
}

}  // namespace

namespace {

struct ChatTurn {
  int prompt = -1, cached = -1, prefilled = -1;
  std::string end;
};

// The --verbose lines of `ultra chat`: "[turn N] prompt P tokens: C cached, F prefilled (...); ... end: E".
std::vector<ChatTurn> chat_turns(const std::string& err) {
  std::vector<ChatTurn> turns;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line)) {
    int n = 0;
    ChatTurn t;
    char end[32] = {};
    if (std::sscanf(line.c_str(), "[turn %d] prompt %d tokens: %d cached, %d prefilled", &n, &t.prompt,
                    &t.cached, &t.prefilled) != 4)
      continue;
    const size_t e = line.find("end: ");
    if (e != std::string::npos && std::sscanf(line.c_str() + e, "end: %31s", end) == 1) t.end = end;
    EXPECT_EQ(n, (int)turns.size() + 1) << line;
    turns.push_back(t);
  }
  return turns;
}

std::string ids_csv(std::string ids) {
  while (!ids.empty() && (ids.back() == '\n' || ids.back() == ' ')) ids.pop_back();
  std::replace(ids.begin(), ids.end(), ' ', ',');
  return ids;
}

// `ultra chat` with the bundled model (its own play-script template; a reply ends at a blank line), two
// turns piped through stdin, greedy: the output is deterministic, the first reply is the greedy
// continuation of the template's rendering (through `ultra run`), and the second turn prefills only what
// follows the conversation the cache already holds, with the same output as a chat that re-prefills
// everything (--no-cache-prompt). /clear starts a new conversation.
TEST(Cli, ChatTwoTurnsReuseTheCache) {
  const TmpDir tmp("ultra_cli");
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "Good morrow, fair lady!\nWhat news from Mantua?\n";
  const Out a = ultra("chat --temp 0 --verbose < " + in);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("chat template: the model's"), std::string::npos) << a.err;
  const Out b = ultra("chat --temp 0 --verbose < " + in);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  const auto turns = chat_turns(a.err);
  ASSERT_EQ(turns.size(), 2u) << a.err;
  EXPECT_EQ(turns[0].cached, 0);
  EXPECT_EQ(turns[0].prefilled, turns[0].prompt);
  EXPECT_EQ(turns[0].end, "stop");
  // The second rendering starts with the first one and its reply: all of that is reused.
  EXPECT_GT(turns[1].cached, turns[0].prompt);
  EXPECT_EQ(turns[1].cached + turns[1].prefilled, turns[1].prompt);
  EXPECT_LT(turns[1].prefilled, turns[1].prompt / 2);

  // Each reply is followed by a newline and ends at a blank line, so none holds an empty line.
  EXPECT_EQ(a.out.find("\n\n"), std::string::npos) << a.out;

  // The first reply is greedy generation from the template's rendering, up to its blank line.
  const std::string prompt = tmp.file("prompt.txt");
  std::ofstream(prompt) << "ROMEO:\nGood morrow, fair lady!\n\nJULIET:\n";
  const std::string model = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();
  const Out ids = ultra("tokenize -m " + model + " -f " + prompt + " --ids");
  ASSERT_EQ(ids.code, 0) << ids.err;
  const Out run = ultra("run --prompt-ids " + ids_csv(ids.out) + " --temp 0 -n 64 --json");
  ASSERT_EQ(run.code, 0) << run.err;
  const std::string text = json::parse(run.out)["generated_text"];
  const size_t blank = text.find("\n\n");
  ASSERT_NE(blank, std::string::npos) << text;
  const std::string reply1 = text.substr(0, blank) + "\n";
  EXPECT_EQ(a.out.substr(0, reply1.size()), reply1) << a.out;
  EXPECT_GT(a.out.size(), reply1.size());

  // Re-prefilling everything gives the same replies.
  const Out c = ultra("chat --temp 0 --verbose --no-cache-prompt < " + in);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out, a.out);
  const auto full = chat_turns(c.err);
  ASSERT_EQ(full.size(), 2u);
  EXPECT_EQ(full[1].cached, 0);
  EXPECT_EQ(full[1].prompt, turns[1].prompt);

  // /clear: the third turn is the first one again (its reply too), reusing only the common beginning.
  std::ofstream(in) << "Good morrow, fair lady!\nWhat news from Mantua?\n/clear\nGood morrow, fair "
                       "lady!\n/exit\nnot read\n";
  const Out d = ultra("chat --temp 0 --verbose < " + in);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("(conversation cleared)"), std::string::npos);
  const auto t3 = chat_turns(d.err);
  ASSERT_EQ(t3.size(), 3u) << d.err;
  EXPECT_EQ(t3[2].prompt, turns[0].prompt);
  EXPECT_LT(t3[2].cached, t3[2].prompt);
  EXPECT_EQ(d.out, a.out + reply1);
}

// A system message, a --chat-template file, --stop and -n; errors for an unreadable template and a
// message longer than the context.
TEST(Cli, ChatOptionsAndErrors) {
  const TmpDir tmp("ultra_cli");
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "Hello\n/frobnicate\n";
  const std::string tmpl = tmp.file("t.jinja");
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.role | upper }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}ASSISTANT:{% endif %}";
  const Out a =
      ultra("chat --temp 0 --verbose -n 5 --system 'Be brief.' --chat-template " + tmpl + " < " + in);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("unknown command /frobnicate"), std::string::npos) << a.err;
  auto turns = chat_turns(a.err);
  ASSERT_EQ(turns.size(), 1u) << a.err;
  EXPECT_EQ(turns[0].end, "length");
  const std::string model = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();
  const std::string prompt = tmp.file("prompt.txt");
  std::ofstream(prompt) << "SYSTEM: Be brief.\nUSER: Hello\nASSISTANT:";
  const Out ids = ultra("tokenize -m " + model + " -f " + prompt + " --ids");
  ASSERT_EQ(ids.code, 0);
  EXPECT_EQ(turns[0].prompt, (int)std::count(ids.out.begin(), ids.out.end(), ' ') + 1) << ids.out;

  // -m disables the bundled model's blank-line stop; --stop '\n' (an escape) ends the reply at a newline.
  const Out s = ultra("chat -m " + model + " --temp 0 --verbose --stop '\\n' < " + in);
  ASSERT_EQ(s.code, 0) << s.err;
  turns = chat_turns(s.err);
  ASSERT_EQ(turns.size(), 1u) << s.err;
  EXPECT_EQ(turns[0].end, "stop");
  EXPECT_EQ(std::count(s.out.begin(), s.out.end(), '\n'), 1) << s.out;

  std::ofstream(tmp.file("bad.jinja")) << "{% frobnicate %}";
  expect_error("chat --chat-template " + tmp.file("bad.jinja") + " < /dev/null", "frobnicate");
  std::ofstream(in) << std::string(2000, 'x') << "\nHello\n";
  const Out l = ultra("chat --temp 0 -n 2 --verbose < " + in);
  EXPECT_EQ(l.code, 0) << l.err;
  EXPECT_NE(l.err.find("the message is too long"), std::string::npos) << l.err;
  EXPECT_EQ(chat_turns(l.err).size(), 1u) << l.err;
}

// A template whose prompt ends inside a <think> block: the reply is all reasoning, shown, and kept out of the
// conversation (turn 2's prompt does not hold it); --reasoning-format none keeps it in.
TEST(Cli, ChatReasoningStaysOutOfTheConversation) {
  const TmpDir tmp("ultra_cli");
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "hello there\nagain\n";
  const std::string tmpl = tmp.file("think.jinja");
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n";
  const std::string cmd = "chat --temp 0 --verbose -n 8 --chat-template " + tmpl;
  const Out a = ultra(cmd + " < " + in), b = ultra(cmd + " --reasoning-format none < " + in);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const auto ta = chat_turns(a.err), tb = chat_turns(b.err);
  ASSERT_EQ(ta.size(), 2u) << a.err;
  ASSERT_EQ(tb.size(), 2u) << b.err;
  EXPECT_EQ(ta[0].prompt, tb[0].prompt);
  EXPECT_EQ(a.out.substr(0, 12), b.out.substr(0, 12));  // the same first reply, shown
  EXPECT_GT(tb[1].prompt, ta[1].prompt + 4) << "the reasoning went into the conversation";
  const Out e = ultra(cmd + " --reasoning-format sometimes < " + in);
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.err.find("--reasoning-format: sometimes not in {auto,none}"), std::string::npos) << e.err;
}

// Ctrl-C while a reply is generated stops the reply, not the program: the chat goes on to the next line;
// Ctrl-C at the prompt exits with status 0. (The reply would take far longer than the test's deadline:
// no stop string, no length limit, a long context.)
TEST(Cli, ChatCtrlCStopsTheReply) {
  const TmpDir tmp("ultra_cli");
  const std::string err = tmp.file("stderr.txt");
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    for (int f : {to_child[0], to_child[1], from_child[0], from_child[1], fd}) close(f);
    execl(ULTRA_ULTRA_BIN, "ultra", "chat", "-c", "4096", "--stop", "", "--temp", "0", "--verbose", "-t", "1",
          (char*)nullptr);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  const auto t0 = std::chrono::steady_clock::now();
  const auto say = [&](const std::string& s) {
    return write(to_child[1], s.data(), s.size()) == (ssize_t)s.size();
  };
  const auto stderr_has = [&](const std::string& what) {
    for (int i = 0; i < 3000; ++i) {  // 30 s
      std::ifstream f(err);
      const std::string e((std::istreambuf_iterator<char>(f)), {});
      if (e.find(what) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(say("Good morrow!\n"));
  char buf[4096];
  ASSERT_GT(read(from_child[0], buf, sizeof buf), 0);  // the reply has begun
  kill(pid, SIGINT);
  EXPECT_TRUE(stderr_has("(stopped)"));
  EXPECT_TRUE(stderr_has("end: interrupted"));
  {  // the rest of the first reply (all written before the verbose line) is drained first
    const int fl = fcntl(from_child[0], F_GETFL);
    fcntl(from_child[0], F_SETFL, fl | O_NONBLOCK);
    while (read(from_child[0], buf, sizeof buf) > 0) {
    }
    fcntl(from_child[0], F_SETFL, fl);
  }
  ASSERT_TRUE(say("And you?\n"));
  ASSERT_GT(read(from_child[0], buf, sizeof buf), 0);  // still alive: a second reply
  kill(pid, SIGINT);
  EXPECT_TRUE(stderr_has("[turn 2]"));
  kill(pid, SIGINT);  // at the prompt: exits
  std::string rest;
  ssize_t n;
  while ((n = read(from_child[0], buf, sizeof buf)) > 0) rest.append(buf, (size_t)n);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  close(to_child[1]);
  close(from_child[0]);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
  std::ifstream f(err);
  const std::string e((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(chat_turns(e).size(), 2u) << e;
}

}  // namespace

namespace {

const std::string kTarget = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();

// Standard output that cannot be written (a full device) is an error: non-zero exit and a message, for
// streamed text, JSON, the tokenize listing, chat replies and the bench table alike.
TEST(Cli, StdoutWriteErrorsFail) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const TmpDir tmp("ultra_cli");
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "Good morrow, fair lady!\n";
  for (const std::string& args :
       {std::string("run -p ROMEO: -n 8 --temp 0"), std::string("run -p ROMEO: -n 8 --temp 0 --json"),
        std::string("run --prompt-ids 1,2 -n 4 --temp 0 -m ") + (kHf / "llama_gqa").string(),
        "tokenize -m " + kTarget + " hello", "chat --temp 0 -n 4 < " + in,
        "bench -m " + (kHf / "mistral").string() + " -p 4 -n 2 -r 1 -t 1", std::string("--help"),
        std::string("run --help")}) {
    const Out o = ultra(args + " > /dev/full");
    EXPECT_EQ(o.code, 1) << args << "\n" << o.err;
    EXPECT_NE(o.err.find("error: standard output: write failed: No space left on device"), std::string::npos)
        << args << "\n"
        << o.err;
  }
}

// Peak resident memory (KiB) of `ultra ARGS...` with its standard output to /dev/null.
long peak_rss_kb(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    dup2(fd, 2);
    alarm(120);  // a hang ends the child (SIGALRM), which fails the test
    std::vector<char*> argv{const_cast<char*>("ultra")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(ULTRA_ULTRA_BIN, argv.data());
    _exit(127);
  }
  int st = 0;
  rusage ru{};
  if (pid < 0 || wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  return ru.ru_maxrss;
}

// Writes a text of random words of at least `bytes` bytes to path; returns its size.
size_t write_words(const std::string& path, size_t bytes) {
  const char* words[] = {"the ", "king ", "ROMEO:\n", "love ", "thou ", "art ", "fair, ", "and ", "night! "};
  std::ofstream f(path);
  size_t size = 0;
  for (uint32_t x = 1; size < bytes;) {
    x = x * 1103515245u + 12345u;
    const char* w = words[(x >> 16) % 9];
    f << w;
    size += std::strlen(w);
  }
  return size;
}

// tokenize -f writes its listing (about 20 bytes per token) in chunks as it goes: on a 6 MB text its peak
// memory is that of --ids (which also streams), not the whole listing more (about 5x the text before).
TEST(Cli, TokenizeStreamsTheListing) {
  const TmpDir tmp("ultra_cli");
  const std::string big = tmp.file("big.txt");
  const size_t size = write_words(big, 6u << 20);
  const long listing = peak_rss_kb({"tokenize", "-m", kTarget, "-f", big});
  const long ids = peak_rss_kb({"tokenize", "-m", kTarget, "-f", big, "--ids"});
  ASSERT_GT(listing, 0);
  ASSERT_GT(ids, 0);
  EXPECT_LT(listing, ids + (long)(size / 1024) / 2)
      << "listing " << listing << " KiB, --ids " << ids << " KiB";

  // The chunked listing is whole: one line per id, the ids in order.
  const std::string mid = tmp.file("mid.txt");
  std::ofstream(mid) << file_bytes(big).substr(0, 200000);
  const Out l = ultra("tokenize -m " + kTarget + " -f " + mid);
  const Out i = ultra("tokenize -m " + kTarget + " -f " + mid + " --ids");
  ASSERT_EQ(l.code, 0) << l.err;
  ASSERT_EQ(i.code, 0) << i.err;
  ASSERT_GT(l.out.size(), 3u << 16);  // several chunks
  std::istringstream ls(l.out), is(i.out);
  std::string line;
  int n = 0;
  while (std::getline(ls, line)) {
    int want = -1;
    ASSERT_TRUE(is >> want);
    EXPECT_EQ(std::stoi(line.substr(0, 7)), want) << "line " << n;
    ++n;
  }
  int extra;
  EXPECT_FALSE(is >> extra);
  EXPECT_GT(n, 30000);
}

// tokenize -f reads its file in chunks and encodes them as they come (EncodeStream): its peak memory on a
// 16 MB text is within 8 MB of that on a 1 MB one, for the listing and --ids alike. Before, the whole text,
// its pre-tokens and its ids were held at once (about 7 bytes per byte of text).
TEST(Cli, TokenizeFileInBoundedMemory) {
  const TmpDir tmp("ultra_cli");
  const std::string small = tmp.file("small.txt"), big = tmp.file("big.txt");
  write_words(small, 1u << 20);
  // Under the sanitizers 4 MB: the same chunked reads and the same 8 MB bound, which holding the whole text
  // (21 MB more than on 1 MB) would still exceed; 16 MB in the normal build.
  write_words(big, ultra::test::kSanitized ? 4u << 20 : 16u << 20);
  for (const bool ids : {false, true}) {
    std::vector<std::string> args = {"tokenize", "-m", kTarget};
    if (ids) args.push_back("--ids");
    args.insert(args.end(), {"-f", small});
    const long base = peak_rss_kb(args);
    args.back() = big;
    const long peak = peak_rss_kb(args);
    ASSERT_GT(base, 0);
    ASSERT_GT(peak, 0);
    EXPECT_LT(peak - base, 8 * 1024) << (ids ? "--ids" : "listing") << ": peak RSS " << base
                                     << " KiB on 1 MB of text, " << peak << " KiB on 16 MB";
  }
}

// SIGTERM or SIGINT while quantize writes its output: the hidden temporary file is removed, and the exit
// status is the signal's. The signal is sent while the temporary file is being written (the process stopped
// first, so it cannot finish in between); if a run ends before its temporary file is seen, another is
// started.
TEST(Cli, SignalRemovesTheTemporaryOutput) {
  for (const int sig : {SIGTERM, SIGINT}) {
    const TmpDir tmp("ultra_cli");
    const std::string out = tmp.file("out.gguf");
    bool caught = false;
    for (int attempt = 0; attempt < 10 && !caught; ++attempt) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        signal(SIGINT, SIG_DFL);  // not ignored, whatever the test runner's shell did
        signal(SIGTERM, SIG_DFL);
        const int fd = ::open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(ULTRA_ULTRA_BIN, "ultra", "quantize", kTarget.c_str(), out.c_str(), "--type", "ternary",
              (char*)nullptr);
        _exit(127);
      }
      auto tmp_file = [&] {  // the temporary output exists and has been written to
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(tmp.path()))
          if (e.path().filename().string().rfind(".out.gguf.tmp.", 0) == 0 &&
              fs::file_size(e.path(), ec) > 0 && !ec)
            return true;
        return false;
      };
      int st = 0;
      bool exited = false;
      while (!tmp_file()) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
          exited = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (!exited) {
        kill(pid, SIGSTOP);
        caught = tmp_file();  // still there: the process is between creating and renaming it
        kill(pid, sig);
        kill(pid, SIGCONT);
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
      }
      if (!caught) {  // it finished first: start over
        fs::remove(out);
        continue;
      }
      EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
      EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{}) << strsignal(sig);
    }
    EXPECT_TRUE(caught) << "never caught quantize while it wrote (" << strsignal(sig) << ")";
  }
}

// Malformed numbers are refused with a message naming the value as given; -n 0 generates nothing in run
// and chat alike; an empty output path fails before anything is written.
TEST(Cli, RefusesMalformedValues) {
  const std::string m = (kHf / "llama_gqa").string();
  const std::string run = "run -m " + m + " -n 1 ";
  expect_error(run + "--prompt-ids 1,,2", "an empty element");
  expect_error(run + "--prompt-ids ,1", "an empty element");
  expect_error(run + "--prompt-ids 1,", "an empty element");
  expect_error(run + "--prompt-ids 1,-2", "'-2' is not a token id");
  expect_error(run + "--prompt-ids 18446744073709551615", "token id 18446744073709551615 is out of range");
  expect_error(run + "--prompt-ids 2147483648", "token id 2147483648 is out of range");
  const Out spaced = ultra(run + "--prompt-ids '1, 2 ,3' --json");
  ASSERT_EQ(spaced.code, 0) << spaced.err;
  EXPECT_EQ(json::parse(spaced.out)["prompt_ids"].get<std::vector<int>>(), (std::vector<int>{1, 2, 3}));
  for (const char* seed : {"1e23", "99999999999999999999", "1.5", "-2", "0x10", "''"})
    expect_error(run + "--prompt-ids 1 --seed " + seed, "-s/--seed");
  for (const char* p : {"nan", "inf", "-nan"}) {
    const Out o = ultra("run -p x -n 2 --lookup 2 --draft-p-min " + std::string(p));
    EXPECT_NE(o.code, 0) << p;
    EXPECT_NE(o.err.find("--draft-p-min: '" + std::string(p) + "' is not a finite number"), std::string::npos)
        << o.err;
  }
  const Out half = ultra("run -p x -n 2 --lookup 2 --draft-p-min 0.5 --temp 0");
  EXPECT_EQ(half.code, 0) << half.err;

  const TmpDir tmp("ultra_cli");
  expect_error("quantize " + kTarget + " '' --type q8_0", "OUT: the output path is empty");
  expect_error("convert " + m + " -o ''", "-o: the output path is empty");
  expect_error("quantize " + kTarget + " " + tmp.path().string() + "/ --type q8_0", "names a directory");

  // -n 0: run prefills only; chat prefills the message and replies nothing.
  const Out r0 = ultra("run -p ROMEO: -n 0 --json");
  ASSERT_EQ(r0.code, 0) << r0.err;
  EXPECT_TRUE(json::parse(r0.out)["generated_ids"].empty());
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "Good morrow!\nAnd you?\n";
  const Out c0 = ultra("chat --temp 0 -n 0 --verbose < " + in);
  ASSERT_EQ(c0.code, 0) << c0.err;
  EXPECT_EQ(c0.out, "\n\n");
  const auto turns = chat_turns(c0.err);
  ASSERT_EQ(turns.size(), 2u) << c0.err;
  for (const auto& t : turns) EXPECT_EQ(t.end, "length");
  EXPECT_NE(c0.err.find("reply 0 tokens"), std::string::npos) << c0.err;
}

// run --json counts generated tokens, not target passes: a speculative run's eval_tokens are its tokens
// after the first (as a plain run's), eval_tps their rate, and eval_runs the passes (rounds + plain steps).
TEST(Cli, RunJsonSpeculativeCountsTokens) {
  for (const std::string& spec : {std::string(""), std::string(" --speculative --draft-max 6")}) {
    const Out o = ultra("run -p ROMEO: -n 64 --temp 0 --ignore-eos --json" + spec);
    ASSERT_EQ(o.code, 0) << o.err;
    const json j = json::parse(o.out);
    const json& t = j["timings"];
    EXPECT_EQ(j["generated_ids"].size(), 64u);
    EXPECT_EQ(t["generated_tokens"].get<int>(), 64) << spec;
    EXPECT_EQ(t["eval_tokens"].get<int>(), 63) << spec;
    EXPECT_NEAR(t["eval_tps"].get<double>(), 1e3 * 63 / t["eval_ms"].get<double>(), 1e-6);
    if (spec.empty()) {
      EXPECT_EQ(t["eval_runs"].get<int>(), 63);
    } else {
      const json& s = j["speculative"];
      EXPECT_EQ(t["eval_runs"].get<int>(), s["rounds"].get<int>() + s["plain_steps"].get<int>());
      EXPECT_LT(t["eval_runs"].get<int>(), 63);  // the bundled pair accepts drafts
    }
  }
}

// bench takes llama-bench's comma lists for -p, -n, -t, -b and -ngl: one row per value (and per combination
// of threads and batch size), in the table and in --json.
TEST(Cli, BenchTakesCommaLists) {
  const std::string m = (kHf / "mistral").string();
  const Out o = ultra("bench -m " + m + " -p 4,8 -n 2,3 -r 1 -t 1,2 --json");
  ASSERT_EQ(o.code, 0) << o.err;
  const json j = json::parse(o.out);
  std::vector<std::string> tests;
  std::vector<int> threads;
  for (const auto& r : j["results"]) {
    tests.push_back(r["test"]);
    threads.push_back(r["threads"]);
  }
  EXPECT_EQ(tests, (std::vector<std::string>{"pp4", "pp8", "tg2", "tg3", "pp4", "pp8", "tg2", "tg3"}));
  EXPECT_EQ(threads, (std::vector<int>{1, 1, 1, 1, 2, 2, 2, 2}));
  const Out b = ultra("bench -m " + m + " -p 8 -n 0 -r 1 -t 1 -b 2,8");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.out.find("n_batch"), std::string::npos) << b.out;
  EXPECT_EQ(std::count(b.out.begin(), b.out.end(), '\n'), 4) << b.out;  // header, rule, two rows
  EXPECT_NE(b.out.find("|       2 |        pp8 |"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("|       8 |        pp8 |"), std::string::npos) << b.out;
  const Out bad = ultra("bench -m " + m + " -p 4,x -r 1");
  EXPECT_NE(bad.code, 0);
  // -ngl: a device per value (0: the CPU).
  const Out g = ultra("bench -m " + m + " -p 4 -n 0 -r 1 -t 1 -ngl 0,0 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const json gj = json::parse(g.out);
  ASSERT_EQ(gj["results"].size(), 2u);
  for (const auto& r : gj["results"]) EXPECT_EQ(r["backend"], "CPU");
  // The table is printed a row at a time: without a GPU, -ngl 0,99 shows the CPU row before the error.
  const Out c = ultra("bench -m " + m + " -p 4 -n 0 -r 1 -t 1 -ngl 0,99");
  EXPECT_LT(c.code, 128);
  EXPECT_NE(c.out.find("| CPU     |       1 |        pp4 |"), std::string::npos) << c.out;
  if (c.code != 0) EXPECT_NE(c.err.find("CUDA"), std::string::npos) << c.err;
}

}  // namespace

namespace {

// --grammar FILE constrains `ultra run` and `ultra chat` (the reply is a sentence of the grammar); a bad
// grammar is an error with the parser's message; --json-schema constrains the reply to the schema, and a
// keyword a grammar cannot express is an error naming it.
TEST(Cli, GrammarFlags) {
  const TmpDir tmp("ultra_cli_grammar");
  const std::string g = tmp.file("obj.gbnf"), bad = tmp.file("bad.gbnf");
  std::ofstream(g) << R"(root ::= "{\"n\": " [0-9]{1,3} "}")"
                   << "\n";
  std::ofstream(bad) << "root ::= (\n";
  const std::string model = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();
  const Out o = ultra("run -m " + model + " -p 'Once upon a time' -n 30 --temp 0.9 -s 4 --grammar " + g);
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string reply = o.out.substr(o.out.find("Once upon a time") + 16);
  EXPECT_TRUE(nlohmann::json::parse(reply, nullptr, false).is_object()) << o.out;
  const std::string in = tmp.file("in.txt");
  std::ofstream(in) << "hello\nagain\n";
  const Out c = ultra("chat -m " + model + " -n 30 -s 4 --grammar " + g + " < " + in);
  EXPECT_EQ(c.code, 0) << c.err;
  size_t at = 0;
  for (int turn = 0; turn < 2; ++turn) {  // each reply is an object of the grammar
    at = c.out.find("{\"n\": ", at);
    ASSERT_NE(at, std::string::npos) << c.out;
    const size_t end = c.out.find('}', at);
    ASSERT_NE(end, std::string::npos) << c.out;
    EXPECT_TRUE(nlohmann::json::parse(c.out.substr(at, end + 1 - at), nullptr, false).is_object()) << c.out;
    at = end;
  }
  const Out b = ultra("run -m " + model + " -p x --grammar " + bad);
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.err.find("line 2, column 1"), std::string::npos) << b.err;
  // --json-schema: the reply validates (an object with an integer n in [0, 99] and nothing else).
  const Out js = ultra("run -m " + model +
                       " -p 'Once upon a time' -n 256 --temp 0.9 -s 4 --json-schema '{\"type\": \"object\", "
                       "\"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 99}}, "
                       "\"required\": [\"n\"], \"additionalProperties\": false}'");
  ASSERT_EQ(js.code, 0) << js.err;
  const nlohmann::json obj =
      nlohmann::json::parse(js.out.substr(js.out.find("Once upon a time") + 16), nullptr, false);
  ASSERT_TRUE(obj.is_object()) << js.out;
  ASSERT_EQ(obj.size(), 1u) << js.out;
  ASSERT_TRUE(obj["n"].is_number_integer()) << js.out;
  EXPECT_GE(obj["n"].get<int>(), 0);
  EXPECT_LE(obj["n"].get<int>(), 99);
  const Out s = ultra("run -m " + model + " -p x --json-schema '{\"type\": \"number\", \"multipleOf\": 3}'");
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.err.find("unsupported keyword 'multipleOf' at /multipleOf"), std::string::npos) << s.err;
  const Out both = ultra("run -m " + model + " -p x --json-schema '{}' --grammar " + g);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
}

}  // namespace
