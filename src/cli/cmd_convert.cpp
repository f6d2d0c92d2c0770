// ultra convert HF_DIR -o model.gguf [--outtype f16]
#include <fmt/format.h>

#include <chrono>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/convert.h"

namespace ultra::cli {

int cmd_convert(int argc, char** argv) {
  CLI::App app{"Convert an HF model directory (config.json + safetensors) to GGUF", "ultra convert"};
  std::string in, out, type = "f16";
  app.add_option("HF_DIR", in, "HF model directory")->required();
  app.add_option("-o,--outfile", out, "output GGUF path")->required();
  app.add_option("--outtype", type,
                 "weight type of the 2-D matrices: f32, f16, bf16, q8_0 (or fp8, ternary, tq1_0, tq2_0: see "
                 "ultra quantize)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (out.empty()) fail("-o: the output path is empty");
  // SIGINT/SIGTERM/SIGHUP while the output is written remove its temporary file (then end the process).
  remove_partial_output_on_signals();
  ConvertOptions opt = convert_options(type);
  const auto t0 = std::chrono::steady_clock::now();
  const int n = convert_hf_to_gguf(in, out, opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "wrote {} ({} tensors, {}) in {:.2f} s\n", out, n, type, s);
  return 0;
}

}  // namespace ultra::cli
