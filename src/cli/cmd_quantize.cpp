// ultra quantize IN OUT --type q4_k_m|q6_k|iq4_xs|...|fp8|ternary|tq2_0|tq1_0|q8_0 [--imatrix FILE]
//   [--keep-embeddings] [--ternary-per-row] [--threads N]
// or in llama-quantize's order: ultra quantize IN OUT TYPE [THREADS]
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/convert.h"

namespace ultra::cli {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Quantize the weight matrices of a GGUF file or an HF model directory to a GGUF file",
               "ultra quantize"};
  std::string in, out, type, imatrix;
  bool keep_embeddings = false, per_row = false;
  int threads = 0;
  app.add_option("IN", in, "GGUF file or HF model directory")->required();
  app.add_option("OUT", out, "output GGUF path")->required();
  std::string type_pos;
  int threads_pos = -1;
  app.add_option("TYPE", type_pos, "the type, in llama-quantize's order (IN OUT TYPE [THREADS]): as --type");
  app.add_option("THREADS", threads_pos, "threads, in llama-quantize's order: as --threads")
      ->check(CLI::NonNegativeNumber);
  auto* type_opt = app.add_option(
      "--type", type,
      "llama.cpp's mixes (GGUF input; the tensor types llama-quantize chooses): q4_0, q4_1, q5_0, "
      "q5_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs; "
      "or every matrix in one type: fp8 (E4M3, a scale per row), ternary (BitNet b1.58), tq2_0, "
      "tq1_0 (llama.cpp's ternary), q8_0, f16, bf16, f32 (required, or TYPE)");
  app.add_option("--imatrix", imatrix,
                 "llama.cpp importance matrix (llama-imatrix's GGUF, or a legacy .dat) for the mixes");
  auto* threads_opt =
      app.add_option("--threads,-t", threads, "threads quantizing a matrix's rows (mixes; default: all)")
          ->check(CLI::NonNegativeNumber);
  app.add_flag("--keep-embeddings", keep_embeddings, "leave token_embd and output in their input type");
  app.add_flag("--ternary-per-row", per_row, "ternary: one scale per output row instead of one per tensor");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (out.empty()) fail("OUT: the output path is empty");
  if (!type_pos.empty() && type_opt->count() && type_pos != type)
    fail("the type is given twice: TYPE '{}' and --type '{}'", type_pos, type);
  if (!type_pos.empty()) type = type_pos;
  if (type.empty()) fail("no type: give --type T or the type after OUT (ultra quantize IN OUT q4_k_m)");
  if (threads_pos >= 0 && threads_opt->count() && threads_pos != threads)
    fail("the thread count is given twice: THREADS {} and --threads {}", threads_pos, threads);
  if (threads_pos >= 0) threads = threads_pos;
  // SIGINT/SIGTERM/SIGHUP while the output is written remove its temporary file (then end the process).
  remove_partial_output_on_signals();
  ConvertOptions opt = convert_options(type);
  opt.keep_embeddings = keep_embeddings;
  opt.ternary_per_row = per_row;
  opt.imatrix = imatrix;
  opt.threads = threads;
  // a line per tensor, as llama-quantize prints them
  opt.progress = [](int done, int total, const std::string& what) {
    fmt::print(stderr, "[{:4}/{:4}] {}\n", done, total, what);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const int n = quantize_model(in, out, opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(out, ec);
  fmt::print(stderr, "wrote {} ({} tensors, {}, {:.2f} MiB) in {:.2f} s\n", out, n, type,
             ec ? 0.0 : (double)bytes / (1 << 20), s);
  return 0;
}

}  // namespace ultra::cli
