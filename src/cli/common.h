// Flags shared by the subcommands that load a model, and small printing helpers.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ultra/context.h"
#include "ultra/convert.h"
#include "ultra/error.h"

namespace ultra::cli {

// Throws ultra::Error with a formatted message; main() prints it as "error: ..." and exits 1.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

struct ModelFlags {
  std::string model;
  int threads = 0;
  int ctx = 0;
  int batch = 512;
  std::string device = "cpu";
  std::string mem_limit;  // "" : the memory available; else bytes with an optional K/M/G/T suffix
  CLI::Option* model_opt = nullptr;
  std::string kv_type;   // "" : the device's default
  bool no_mmap = false;  // --no-mmap: the model read into huge-page memory (LoadParams::mmap)
  int tp = 1;            // --tp N: tensor parallelism over the N ranks of `mpirun -np N` (LoadParams::tp)

  // -m is optional: without it the bundled model (models/target.gguf) is used, see resolve_model().
  void add(CLI::App& app);
  // Fills `model` with the bundled default when -m was not given; throws ultra::Error if it is missing.
  void resolve_model();
  // --tp (ultra run, ultra bench): the model split over the ranks of the MPI job.
  void add_tp(CLI::App& app);
  double tp_timeout = 60;  // --tp-timeout S: the longest wait of one collective (LoadParams::tp_timeout_s)
  LoadParams load_params() const {  // --no-mmap, --tp, --tp-timeout
    return {.mmap = !no_mmap, .tp = tp, .tp_timeout_s = tp_timeout};
  }
  ContextParams context_params() const;
  std::string kv_type_name() const;  // the KV type in use
};

// ultra run's sampling flags (--temp, --top-k, --top-p, --min-p, the penalties, -s/--seed) into sp and seed.
void add_sampling_flags(CLI::App& app, SamplingParams& sp, int64_t& seed);
// sp.seed from seed (< 0: a random one), then sp.validate() (ultra::Error naming the bad field).
void resolve_sampling(SamplingParams& sp, int64_t seed);

// --grammar FILE (GBNF) and --json-schema FILE|JSON (ultra run, ultra chat): what the output must follow.
struct GrammarFlags {
  std::string grammar_file;
  std::string json_schema;
};
void add_grammar_flags(CLI::App& app, GrammarFlags& f);
// The GBNF text the flags ask for ("" for none), checked by parsing it. Throws ultra::Error for both flags,
// a file that cannot be read, a bad grammar (the parser's line, column and message), a schema that is not
// JSON or uses a keyword a grammar cannot express (include/ultra/grammar.h's json_schema_to_gbnf).
std::string resolve_grammar(const GrammarFlags& f);

// "8G", "512M", "1048576" -> bytes (K/M/G/T: powers of 1024); throws ultra::Error otherwise.
size_t parse_bytes(const std::string& s, const char* flag);

// Tensor parallelism (--tp N under mpirun -np N): prints this rank's share of the weights to stderr; on a
// rank other than 0, runs rank 0's steps until rank 0 is done (run_tp_follower) and returns true: the
// command then ends there, printing nothing else.
bool tp_follower_ran(const Model& model);

// Prints the context's warnings to stderr as "warning: ...".
void print_warnings(const Context& ctx);

// --device cpu|cuda and --kv-type f32|f16|bf16 (default: f32 on the CPU, f16 on CUDA).
void add_device_flags(CLI::App& app, std::string& device, std::string& kv_type);
void apply_device_flags(const std::string& device, const std::string& kv_type, ContextParams& p);

// A bundled model (target.gguf, the default model; draft.gguf, its draft): models/NAME next to the
// executable's parent directory (build/ultra -> models/NAME), else in the installed share/ultra/models, else
// in the source tree this binary was built from; "" when none exists.
std::string bundled_model_path(const char* name = "target.gguf");

// "1,2,3" -> {1,2,3} (spaces around an id allowed); throws ultra::Error on anything else: an empty element
// ("1,,2", a leading or trailing comma), a non-digit, or an id of 2^31 or more, named as given.
std::vector<int32_t> parse_id_list(const std::string& s);

// -s/--seed's value: a decimal integer from -1 (random) to 2^63 - 1; throws ultra::Error naming the flag
// otherwise (exponents, fractions, hex, out-of-range numbers).
int64_t parse_seed(const std::string& s);

// CLI11's Range(lo, hi) lets NaN through (every comparison with it is false): this one refuses NaN and the
// infinities too, and names the range.
CLI::Validator finite_range(double lo, double hi);

// Standard output, checked: a full disk (`> /dev/full`), a closed pipe or any other write error ends the
// command with "error: standard output: write failed: ..." and a non-zero exit instead of exit 0.
// put_stdout writes (and flushes when asked), returning false on failure with errno set; write_stdout and
// flush_stdout throw ultra::Error. main() flushes with flush_stdout after every command.
bool put_stdout(std::string_view s, bool flush = false);
void write_stdout(std::string_view s, bool flush = false);
void flush_stdout();
[[noreturn]] void fail_stdout();

std::string human_bytes(double bytes);

// The whole content of a text input ("-": standard input). Anything but a regular file (a directory, a
// FIFO that would block, a device) is refused before it is opened: "<path>: <what> is a directory, ...".
std::string read_text_file(const std::string& path, const char* what);
// The same input, read in chunks of at most 64 KiB, each passed to fn as it is read.
void read_text_chunks(const std::string& path, const char* what,
                      const std::function<void(std::string_view)>& fn);

// --chat-template's value (chat and serve): the content of a file, or else the source of the built-in
// template of that name (src/chat/builtin_templates.h, llama.cpp's names); an existing path wins. label, when
// given, is set to what to call it in messages ("the built-in 'chatml'" or the path). Throws ultra::Error
// listing the built-in names when the value is neither.
std::string chat_template_from_arg(const std::string& value, std::string* label = nullptr);
// The help text of --chat-template, with the built-in names.
std::string chat_template_help();

// Options for convert / quantize of output type `type`, with a one-line progress counter and warnings on
// stderr.
ConvertOptions convert_options(const std::string& type);

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ultra::cli
