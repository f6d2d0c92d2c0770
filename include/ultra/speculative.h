// Speculative decoding: a cheap draft proposes up to K tokens, the target scores all of them (and the
// token before them) in one batched step, and the longest acceptable prefix is kept; both sequences are
// then cropped back in O(1).
//
// Drafts come from a draft model (its own context, same vocabulary as the target) and/or from prompt
// lookup (the continuation of the last n-gram's previous occurrence in the prompt and output so far; no
// model). Acceptance:
//  * greedy (temperature <= 0): a drafted token is kept while it equals the target's argmax; the first
//    mismatch is replaced by the target's token. The output is the target's plain greedy output.
//  * sampling: rejection sampling (Leviathan et al. 2023, Chen et al. 2023). With p and q the target's
//    and the draft's distributions after the same penalties, top-k, temperature, min-p and top-p, a
//    drafted x is kept with probability min(1, p(x) / q(x)); on rejection the token is drawn from
//    normalize(max(0, p - q)). A prompt-lookup draft has q = 1 on its token. The output follows the
//    target's filtered distribution exactly. When all K are kept the target adds a bonus token.
// The random numbers are Philox draws keyed by the target's seed and the position (streams for the
// draft's proposal, the acceptance test and the residual draw), so a seeded run repeats.
#pragma once

#include <cstdint>
#include <span>

#include "ultra/generate.h"

namespace ultra {

struct SpeculativeParams {
  int n_draft = 8;       // K: most tokens drafted per round (--draft-max)
  int n_draft_min = 0;   // a round whose draft is shorter than this decodes one plain token (--draft-min)
  float p_min = 0.0f;    // adaptive length: stop drafting when the draft's most likely token has a
                         // probability below this (--draft-p-min; 0: always K)
  int lookup_ngram = 0;  // prompt lookup: length of the n-gram to match (0: off; --lookup N)
  int draft_seq = 0;     // the sequence used in the draft's context
};

struct SpeculativeStats {
  int64_t rounds = 0;       // verification passes of the target
  int64_t drafted = 0;      // tokens proposed
  int64_t accepted = 0;     // proposals kept
  int64_t from_lookup = 0;  // proposals that came from prompt lookup
  int64_t plain_steps = 0;  // rounds without a draft (one plain target step)
  double draft_ms = 0;      // time in the draft model's steps
  double verify_ms = 0;     // time in the target's steps (verification and plain)
  double acceptance() const { return drafted ? (double)accepted / (double)drafted : 0.0; }
};

// Throws ultra::Error unless the two models can draft for each other: the same vocabulary size and, when
// both have tokenizers, the same token strings.
void check_draft_compatible(const Model& target, const Model& draft);

// generate() with speculation. draft may be null (prompt lookup only: lookup_ngram > 0). The target's
// sampling settings are those of gp.seq in `target` (set_sampling); the draft uses the same settings (in
// greedy mode they are set on the draft's sequence, whose own settings are replaced).
// on_token is called for every emitted token with row = -1 (tokens of a round have no row of their own;
// ctx.logprob() etc. are not available). On return the target's sequence holds the prompt and every
// generated token but the last, as after generate(). Allocates per call, not per round.
GenerateResult generate_speculative(Context& target, Context* draft, std::span<const int32_t> prompt,
                                    const GenerateParams& gp, const SpeculativeParams& sp,
                                    const OnToken& on_token, SpeculativeStats* stats = nullptr);

}  // namespace ultra
