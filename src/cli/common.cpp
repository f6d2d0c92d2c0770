#include "cli/common.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include "chat/builtin_templates.h"
#include "server/constraints.h"
#include "server/json_text.h"
#include "ultra/grammar.h"

namespace ultra::cli {

std::string bundled_model_path(const char* name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    candidates.push_back(exe.parent_path().parent_path() / "models" / name);  // build/ultra
    candidates.push_back(exe.parent_path().parent_path() / "share" / "ultra" / "models" / name);  // bin/
  }
  candidates.push_back(fs::path(ULTRA_SOURCE_DIR) / "models" / name);
  for (const auto& c : candidates)
    if (fs::is_regular_file(c, ec)) return c.string();
  return "";
}

void ModelFlags::resolve_model() {
  if (model_opt && model_opt->count() > 0 && model.empty()) fail("-m: the model path is empty");
  if (!model.empty()) return;
  model = bundled_model_path();
  if (model.empty()) fail("no model given (-m) and the bundled models/target.gguf was not found");
}

void ModelFlags::add(CLI::App& app) {
  model_opt = app.add_option("-m,--model", model,
                             "model: a GGUF file or an HF model directory (default: the bundled model)");
  app.add_option("--mem-limit", mem_limit,
                 "most memory the KV cache and scratch may take, e.g. 8G (default: the memory available)");
  app.add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("-c,--ctx-size", ctx, "context size in tokens (default: the model's, at most 4096)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("-b,--batch-size", batch, "most tokens per prefill step")->check(CLI::Range(1, 65536));
  app.add_flag("--no-mmap", no_mmap,
               "read the model into memory (2 MiB-aligned, advised for huge pages) instead of mapping it: "
               "faster CPU decode, slower load");
  add_device_flags(app, device, kv_type);
}

void ModelFlags::add_tp(CLI::App& app) {
  app.add_option("--tp", tp,
                 "tensor parallelism: split the model over the N ranks of `mpirun -np N` (rank 0 runs the "
                 "command, the others its steps)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--tp-timeout", tp_timeout,
                 "--tp: seconds a step waits for the other ranks before it fails (a rank that stopped or "
                 "died); the job then ends with that error")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
}

bool tp_follower_ran(const Model& model) {
  const ModelInfo& i = model.info();
  if (i.tp_size == 1) return false;
  fmt::print(stderr, "tp: rank {} of {}: weights {} of {}\n", i.tp_rank, i.tp_size,
             human_bytes((double)i.shard_weight_bytes), human_bytes((double)i.weight_bytes));
  if (i.tp_rank == 0) return false;
  run_tp_follower(model);
  return true;
}

void add_sampling_flags(CLI::App& app, SamplingParams& sp, int64_t& seed) {
  app.add_option("--temp", sp.temperature, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "top-p (1.0: off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty (1.0: off)")
      ->capture_default_str();
  app.add_option("--repeat-last-n", sp.repeat_last_n, "tokens the penalties look back at (-1: all)")
      ->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option_function<std::string>(
         "-s,--seed", [&seed](const std::string& v) { seed = parse_seed(v); }, "RNG seed (-1: random)")
      ->type_name("INT");
}

void add_grammar_flags(CLI::App& app, GrammarFlags& f) {
  app.add_option("--grammar", f.grammar_file, "a GBNF grammar (llama.cpp's syntax) the output must follow")
      ->type_name("FILE");
  app.add_option("--json-schema", f.json_schema, "a JSON schema the output must follow (a file or the JSON)")
      ->type_name("FILE|JSON");
}

std::string resolve_grammar(const GrammarFlags& f) {
  if (!f.grammar_file.empty() && !f.json_schema.empty())
    fail("give either --grammar or --json-schema, not both");
  std::string text;
  if (!f.grammar_file.empty()) {
    text = read_text_file(f.grammar_file, "--grammar");
    try {
      check_grammar(text);
    } catch (const Error& e) {
      fail("--grammar {}: {}", f.grammar_file, e.what());
    }
  } else if (!f.json_schema.empty()) {
    const std::string src = std::filesystem::exists(f.json_schema)
                                ? read_text_file(f.json_schema, "--json-schema")
                                : f.json_schema;
    if (server::parse_json_text(src, nullptr, /*allow_exceptions=*/false).is_discarded())
      fail("--json-schema: neither a file nor valid JSON: {}", f.json_schema.substr(0, 80));
    try {
      text = json_schema_to_gbnf(src);  // the file's own property order
    } catch (const Error& e) {
      fail("--json-schema: {}", e.what());
    }
  }
  return text;
}

void resolve_sampling(SamplingParams& sp, int64_t seed) {
  sp.seed = seed < 0 ? (uint64_t)std::random_device{}() : (uint64_t)seed;
  sp.validate();
}

void add_device_flags(CLI::App& app, std::string& device, std::string& kv_type) {
  app.add_option("--device", device, "where the model runs: cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  // llama.cpp's flag: any layer on the GPU means the whole model there (ultra does not split a model).
  app.add_option_function<int>(
         "--n-gpu-layers", [&device](int n) { device = n > 0 ? "cuda" : "cpu"; },
         "llama.cpp compatibility (also -ngl): > 0 is --device cuda (all layers), 0 is --device cpu")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--kv-type", kv_type,
                 "KV cache element type: f32, f16 or bf16 (default: f32 on cpu, f16 on cuda)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
}

void apply_device_flags(const std::string& device, const std::string& kv_type, ContextParams& p) {
  p.backend = device == "cuda" ? BackendKind::cuda : BackendKind::cpu;
  const std::string t = kv_type.empty() ? (device == "cuda" ? "f16" : "f32") : kv_type;
  p.kv_type = t == "bf16" ? KvType::bf16 : t == "f16" ? KvType::f16 : KvType::f32;
  p.upload_progress = [](size_t done, size_t total) {
    fmt::print(stderr, "\rloading the weights into GPU memory: {:3.0f}% ({} of {})", 100.0 * done / total,
               human_bytes((double)done), human_bytes((double)total));
    if (done == total) fmt::print(stderr, "\n");
  };
}

std::string ModelFlags::kv_type_name() const {
  return kv_type.empty() ? (device == "cuda" ? "f16" : "f32") : kv_type;
}

ContextParams ModelFlags::context_params() const {
  ContextParams p;
  p.n_ctx = ctx;
  p.n_batch = batch;
  p.n_threads = threads;
  if (!mem_limit.empty()) p.mem_limit = parse_bytes(mem_limit, "--mem-limit");
  apply_device_flags(device, kv_type, p);
  return p;
}

size_t parse_bytes(const std::string& s, const char* flag) {
  size_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  const std::string_view unit(end, s.data() + s.size() - end);
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  if (unit == "T" || unit == "TiB") shift = 40;
  if (ec != std::errc() || shift < 0 || v == 0 || v > (SIZE_MAX >> shift))
    fail("{} '{}': expected a positive size such as 8G, 512M or 1048576", flag, s);
  return v << shift;
}

void print_warnings(const Context& ctx) {
  for (const std::string& w : ctx.warnings()) fmt::print(stderr, "warning: {}\n", w);
}

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  for (;;) {  // one comma-separated element per iteration
    const size_t end = std::min(s.find(',', i), s.size());
    size_t b = i, e = end;
    while (b < e && s[b] == ' ') ++b;
    while (e > b && s[e - 1] == ' ') --e;
    const std::string_view elem(s.data() + b, e - b);
    if (elem.empty())
      fail("invalid token id list '{}': an empty element (expected ids separated by commas, e.g. 1,2,3)", s);
    if (elem.find_first_not_of("0123456789") != std::string_view::npos)
      fail("invalid token id list '{}': '{}' is not a token id (expected e.g. 1,2,3)", s, elem);
    int32_t v = 0;
    auto [p, ec] = std::from_chars(elem.data(), elem.data() + elem.size(), v);
    if (ec != std::errc() || p != elem.data() + elem.size())
      fail("token id {} is out of range (token ids are below 2^31)", elem);
    ids.push_back(v);
    if (end == s.size()) break;
    i = end + 1;
  }
  return ids;
}

int64_t parse_seed(const std::string& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < -1)
    fail("-s/--seed '{}': expected an integer from -1 (random) to {}", s, INT64_MAX);
  return v;
}

CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& in) -> std::string {
        double v = 0;
        auto [p, ec] = std::from_chars(in.data(), in.data() + in.size(), v);
        if (in.empty() || ec != std::errc() || p != in.data() + in.size() || !std::isfinite(v))
          return fmt::format("'{}' is not a finite number", in);
        if (v < lo || v > hi) return fmt::format("Value {} not in range {} to {}", in, lo, hi);
        return {};
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

bool put_stdout(std::string_view s, bool flush) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) return false;
  return !flush || (std::fflush(stdout) == 0 && !std::ferror(stdout));
}

void fail_stdout() {
  const int e = errno;
  fail("standard output: write failed: {}", e ? std::strerror(e) : "I/O error");
}

void write_stdout(std::string_view s, bool flush) {
  if (!put_stdout(s, flush)) fail_stdout();
}

void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) fail_stdout();
}

namespace {

// Opens a text input ("-": standard input), refusing what is not a regular file; *size: its size when known.
std::unique_ptr<std::FILE, int (*)(std::FILE*)> open_text_input(const std::string& path, const char* what,
                                                                uintmax_t* size) {
  namespace fs = std::filesystem;
  *size = 0;
  if (path == "-") return {stdin, [](std::FILE*) { return 0; }};
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) fail("{}: cannot open {}: {}", path, what, ec.message());
  if (!fs::is_regular_file(st))
    fail("{}: {} is {}, expected a regular file", path, what,
         fs::is_directory(st) ? "a directory"
         : fs::is_fifo(st)    ? "a FIFO"
                              : "not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail("{}: cannot open {}: {}", path, what, std::strerror(errno));
  if (const uintmax_t n = fs::file_size(path, ec); !ec) *size = n;
  return f;
}

// Passes the input to fn in chunks of at most 64 KiB as they are read.
void read_chunks(std::FILE* f, const std::string& path, const std::function<void(std::string_view)>& fn) {
  std::vector<char> buf(1 << 16);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) fn(std::string_view(buf.data(), n));
  if (std::ferror(f)) fail("{}: read error: {}", path == "-" ? "standard input" : path, std::strerror(errno));
}

}  // namespace

void read_text_chunks(const std::string& path, const char* what,
                      const std::function<void(std::string_view)>& fn) {
  uintmax_t size = 0;
  const auto f = open_text_input(path, what, &size);
  read_chunks(f.get(), path, fn);
}

std::string read_text_file(const std::string& path, const char* what) {
  // Read straight into the result (a stringstream would hold the text twice at its peak).
  std::string text;
  uintmax_t size = 0;
  const auto f = open_text_input(path, what, &size);
  text.reserve(size);
  read_chunks(f.get(), path, [&text](std::string_view c) { text.append(c); });
  return text;
}

std::string chat_template_from_arg(const std::string& value, std::string* label) {
  std::error_code ec;
  if (value == "-" || std::filesystem::exists(value, ec)) {
    if (label) *label = value;
    return read_text_file(value, "chat template");
  }
  if (const BuiltinChatTemplate* t = find_builtin_chat_template(value)) {
    if (label) *label = fmt::format("the built-in '{}'", t->name);
    return std::string(t->source);
  }
  fail("--chat-template '{}': no such file, and not the name of a built-in template (built-ins: {})", value,
       builtin_chat_template_names());
}

std::string chat_template_help() {
  return "a Jinja chat template FILE to use instead of the model's own, or the NAME of a built-in one: " +
         builtin_chat_template_names();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

ConvertOptions convert_options(const std::string& type) {
  ConvertOptions opt;
  opt.out_type = type;
  opt.progress = [](int done, int total, const std::string& what) {
    fmt::print(stderr, "\r[{:3}/{:3}] {:<40}", done, total, what);
    if (done == total) fmt::print(stderr, "\n");
  };
  opt.warn = [](const std::string& w) { fmt::print(stderr, "warning: {}\n", w); };
  return opt;
}

}  // namespace ultra::cli
