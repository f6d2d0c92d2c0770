// Four sequences in one batched loop with the ultra library: every step carries one row per live
// sequence, each sequence in its own KV slot with its own sampler; the prompts are prefilled together in
// the first step.
//
//   batched MODEL [N_TOKENS]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ultra/ultra.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [N_TOKENS]\n", argv[0]);
    return 2;
  }
  const int n_tokens = argc > 2 ? std::atoi(argv[2]) : 32;
  const std::vector<std::string> prompts = {"ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:"};
  const int n_seq = (int)prompts.size();
  try {
    const ultra::Model model = ultra::Model::load(argv[1]);
    const ultra::Tokenizer* tok = model.tokenizer();
    if (!tok) throw ultra::Error("the model has no tokenizer");

    ultra::Context ctx(model, {.n_ctx = 256, .n_slots = n_seq, .n_batch = 256});
    ultra::Batch batch(256);
    std::vector<int> row(n_seq);  // each sequence's row in the current batch
    std::vector<std::string> out(n_seq);
    std::vector<ultra::TextStream> text;
    for (int s = 0; s < n_seq; ++s) {
      ultra::SamplingParams sp;
      sp.seed = 1000 + s;
      ctx.set_sampling(s, sp);
      text.emplace_back(*tok);
      const std::vector<int32_t> p = tok->encode(prompts[s], true, true);
      batch.add_sequence(p, 0, s, ultra::Output::sample);  // all four prompts in one step
      row[s] = batch.size() - 1;
      out[s] = prompts[s];
    }
    std::vector<bool> live(n_seq, true);
    int n_live = n_seq, steps = 0;
    for (int i = 0; n_live > 0; ++i) {
      ctx.step(batch);
      ++steps;
      batch.clear();
      for (int s = 0; s < n_seq; ++s) {
        if (!live[s]) continue;
        const int32_t t = ctx.sampled(row[s]);
        out[s] += text[s].push(t);
        if (model.is_eog(t) || i + 1 >= n_tokens || ctx.seq_len(s) >= ctx.params().n_ctx) {
          live[s] = false;
          --n_live;
          continue;
        }
        row[s] = batch.add(t, ctx.seq_len(s), s, ultra::Output::sample);
      }
    }
    for (int s = 0; s < n_seq; ++s) {
      out[s] += text[s].flush();
      std::printf("--- sequence %d (%d tokens)\n%s\n", s, ctx.seq_len(s), out[s].c_str());
    }
    std::printf("--- %d steps\n", steps);
    return 0;
  } catch (const ultra::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
