// Generate text from a prompt with the ultra library: load, tokenize, generate, stream the text.
//
//   generate MODEL [PROMPT] [N_TOKENS]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ultra/ultra.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [PROMPT] [N_TOKENS]\n", argv[0]);
    return 2;
  }
  const std::string prompt_text = argc > 2 ? argv[2] : "ROMEO:";
  const int n = argc > 3 ? std::atoi(argv[3]) : 64;
  try {
    const ultra::Model model = ultra::Model::load(argv[1]);
    const ultra::Tokenizer* tok = model.tokenizer();
    if (!tok) throw ultra::Error("the model has no tokenizer");

    ultra::Context ctx(model, {.n_ctx = 512});
    ultra::SamplingParams sp;  // llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    sp.seed = 42;
    ctx.set_sampling(0, sp);

    const std::vector<int32_t> prompt =
        tok->encode(prompt_text, /*add_special=*/true, /*parse_special=*/true);
    ultra::TextStream text(*tok);
    std::fputs(prompt_text.c_str(), stdout);
    ultra::GenerateParams gp;
    gp.n_predict = n;
    const ultra::GenerateResult r = ultra::generate(ctx, prompt, gp, [&](int32_t t, ultra::Context&, int) {
      const std::string_view s = text.push(t);
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    const std::string_view tail = text.flush();
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::printf("\n\n%d tokens in %.1f ms (%.1f tokens/s)\n", r.n_generated, r.prompt_ms + r.eval_ms,
                r.eval_ms > 0 ? 1e3 * r.n_eval / r.eval_ms : 0.0);
    return r.n_generated > 0 ? 0 : 1;
  } catch (const ultra::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
