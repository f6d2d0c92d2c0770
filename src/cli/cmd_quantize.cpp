// ultra quantize IN OUT --type fp8|ternary|tq2_0|tq1_0|q8_0 [--keep-embeddings] [--ternary-per-row]
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
  std::string in, out, type;
  bool keep_embeddings = false, per_row = false;
  app.add_option("IN", in, "GGUF file or HF model directory")->required();
  app.add_option("OUT", out, "output GGUF path")->required();
  app.add_option("--type", type,
                 "fp8 (E4M3, a scale per row), ternary (BitNet b1.58), tq2_0, tq1_0 (llama.cpp's ternary), "
                 "q8_0; also f16, bf16, f32")
      ->required();
  app.add_flag("--keep-embeddings", keep_embeddings, "leave token_embd and output in their input type");
  app.add_flag("--ternary-per-row", per_row, "ternary: one scale per output row instead of one per tensor");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (out.empty()) fail("OUT: the output path is empty");
  // SIGINT/SIGTERM/SIGHUP while the output is written remove its temporary file (then end the process).
  remove_partial_output_on_signals();
  ConvertOptions opt = convert_options(type);
  opt.keep_embeddings = keep_embeddings;
  opt.ternary_per_row = per_row;
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
