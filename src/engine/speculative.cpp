// Speculative decoding on top of Context::step (include/ultra/speculative.h), written as gpt-fast's
// speculative_decode: each round is one Round passed through named stages,
//   draft_lookup     prompt lookup proposes the continuation of an earlier occurrence (no model);
//   draft_on_device  fixed-length rounds on asynchronous backends: the draft's steps and the target's
//                    verification queued at once, the target's rows following the draft's sequence;
//   draft_on_host    the draft model proposes one token per step (its steps queued when greedy and
//                    asynchronous), with q kept on the host for the rejection test when sampling;
//   verify           cur and the drafts in one target step (unless draft_on_device ran it);
//   accept           the longest acceptable prefix, then the correction or bonus token;
//   rollback         both caches cropped back to what was kept.
// The distributions p (target) and q (draft) come from the sampler's own filtered distribution
// (sampling/sampler.h), computed on the host from each row's logits with the sequence's settings and penalty
// window, and the host's draws are the sampler's draw (draw_index), so that the draws and the acceptance test
// follow exactly the function plain sampling uses: a greedy sampler's distribution is the argmax with
// probability 1, which makes the same acceptance rule keep exactly the target's greedy tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "engine/model_impl.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"
#include "ultra/speculative.h"

namespace ultra {

namespace {

// The draft's proposals are drawn with another key than the target's draws at the same positions.
constexpr uint64_t kDraftSeedMix = 0x9E3779B97F4A7C15ull;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A filtered distribution: the kept ids best first and their probabilities (normalised).
struct Dist {
  std::vector<int32_t> ids;  // [n_vocab]
  std::vector<float> probs;  // [n_vocab]
  int n = 0;
  explicit Dist(int n_vocab) : ids(n_vocab), probs(n_vocab) {}
};

// The sampler's draw from d with the uniform u.
int32_t draw(const Dist& d, double u) {
  return d.ids[draw_index(d.probs.data(), d.n, u)];
}

// The continuation of the most recent earlier occurrence of the last `ngram` tokens of h, at most k tokens.
int lookup(std::span<const int32_t> h, int ngram, int k, int32_t* out) {
  const int len = (int)h.size();
  if (ngram <= 0 || len <= ngram) return 0;
  const int32_t* tail = h.data() + len - ngram;
  for (int j = len - ngram - 1; j >= 0; --j) {
    if (!std::equal(tail, tail + ngram, h.data() + j)) continue;
    int n = 0;
    for (int i = j + ngram; i < len && n < k; ++i) out[n++] = h[i];
    return n;
  }
  return 0;
}

// One round: cur, the token emitted last and not yet in the target's cache, at position n; the drafts after
// it; the verification's outcome. Its arrays are sized once per call and reused by every round.
struct Round {
  int n = 0;  // cur goes to position n
  int32_t cur = 0;
  int k_max = 0;  // most drafts this round: K, the tokens still wanted, the room left in the context
  int k = 0;      // drafts [0, k) proposed
  std::vector<int32_t> drafts;      // [K]
  std::vector<uint8_t> from_model;  // [K] 1: the draft model's (q in Speculation::q), 0: prompt lookup
  bool verified = false;            // the target's verification step ran in draft_on_device
  bool compare = false;  // the verification step ran the acceptance test: its sampled tokens decide
  int a = 0;             // drafts accepted
  int32_t next = -1;     // the target's token after them: the correction or the bonus token

  explicit Round(int K) : drafts(K), from_model(K) {}
  void begin(int n_, int32_t cur_, int k_max_) {
    n = n_, cur = cur_, k_max = k_max_;
    k = 0, verified = false, compare = false, a = 0, next = -1;
  }
};

// One call's state: the settings, the modes derived from them, the scratch (allocated once) and the counts.
class Speculation {
 public:
  // K: the most drafts per round; n_prompt: the prompt's length (the batch's capacity).
  Speculation(Context& target, Context* draft, const GenerateParams& gp, const SpeculativeParams& sp, int K,
              int n_prompt, const OnToken& on_token);

  // The prompt in both contexts; returns the first token (the target's last prompt row).
  int32_t start(std::span<const int32_t> prompt);
  // Delivers a token; false when generation ends.
  bool emit(int32_t t);

  void draft_lookup(Round& r);
  void draft_on_device(Round& r);
  void draft_on_host(Round& r);
  void verify(Round& r);
  void accept(Round& r);
  void rollback(const Round& r, int kept);

  Context& target;
  Context* const draft;
  const GenerateParams& gp;
  const SpeculativeParams& sp;
  const int seq, dseq, n_ctx, K;
  const SamplingParams& tp;  // the target's sampling settings
  SamplingParams dp;         // the draft's: the same with its own key
  const int n_sample;
  // Greedy rounds sample inside the steps (Output::sample: the argmax, with the penalties; the draft's
  // probability of it for --draft-p-min), so only tokens leave the device; sampled rounds need the logits
  // of every row on the host for the rejection test.
  //
  // On a backend with speculative outputs (the GPU), sampled rounds also keep everything on the device: the
  // draft's steps are Output::propose rows (the device keeps each q), the target's verification rows
  // Output::verify (the rejection test and the residual draw run in its sampler), so their tokens compare
  // with the drafts exactly as greedy ones do. That needs top_k in [1, 1024] (the kept set in shared memory).
  const bool greedy;     // the samplers' greedy shortcut
  const bool spec_rows;  // sampled rounds with Output::propose / Output::verify rows
  const Output out_kind, draft_kind;
  // Rounds of fixed length on asynchronous backends (the GPU) run as one queued round: the target follows
  // the draft's sequence for the round's duration. Not with a grammar on the target's sequence: its masks
  // are computed on the host, from the drafts.
  const bool device_round;

  SpeculativeStats st;
  GenerateResult res;

 private:
  void target_dist(int row, int pos);
  void accept_on_host(Round& r);
  void draft_catch_up(int n, int32_t cur_tok, Output last);

  const OnToken& on_token;
  SamplerScratch scratch;
  Dist p;
  std::vector<Dist> q;  // [K] the draft's distribution of each proposal
  std::vector<float> q_dense, p_dense;
  std::vector<int32_t> history;
  Batch batch, dbatch;
};

Speculation::Speculation(Context& target_, Context* draft_, const GenerateParams& gp_,
                         const SpeculativeParams& sp_, int K_, int n_prompt, const OnToken& on_token_)
    : target(target_),
      draft(draft_),
      gp(gp_),
      sp(sp_),
      seq(gp_.seq),
      dseq(sp_.draft_seq),
      n_ctx(target_.params().n_ctx),
      K(K_),
      tp(target_.sampling(gp_.seq)),
      dp(tp),
      n_sample(target_.n_sample_vocab()),
      greedy(!(tp.temperature > 0.0f)),
      spec_rows(!greedy && target.speculative_outputs() && (!draft || draft->speculative_outputs()) &&
                tp.top_k >= 1 && tp.top_k <= SamplingParams::kMaxSpeculativeTopK && tp.top_k < n_sample),
      out_kind(greedy ? Output::sample : Output::logits),
      draft_kind(greedy ? Output::sample : Output::propose),
      device_round((greedy || spec_rows) && draft && sp.p_min <= 0 && draft->asynchronous() &&
                   target.asynchronous() && !target_.has_grammar(gp_.seq)),
      on_token(on_token_),
      scratch(target_.model().info().n_vocab),
      p(target_.model().info().n_vocab),
      q_dense(target_.model().info().n_vocab, 0.0f),
      p_dense(target_.model().info().n_vocab, 0.0f),
      batch(std::max(K_ + 1, std::min(target_.params().n_batch, n_prompt))),
      dbatch(draft_ ? draft_->params().n_batch : 1) {
  dp.seed ^= kDraftSeedMix;
  if ((greedy || spec_rows) && draft) {
    SamplingParams g = dp;
    g.n_probs = greedy && sp.p_min > 0 ? 1 : 0;
    draft->set_sampling(dseq, g);
  }
  if (draft) q.assign(K, Dist(target.model().info().n_vocab));
  history.reserve(n_ctx);
}

// p for the token after position pos, from the target's row of the last step.
void Speculation::target_dist(int row, int pos) {
  const auto toks = target.seq_tokens(seq).first(pos + 1);
  p.n = sample_distribution(tp, target.logits(row).data(), n_sample, penalty_window(tp, toks), scratch,
                            p.ids.data(), p.probs.data());
}

int32_t Speculation::start(std::span<const int32_t> prompt) {
  const auto t0 = std::chrono::steady_clock::now();
  target.clear(seq);
  const int row = prefill(target, batch, seq, prompt, greedy || spec_rows ? Output::sample : out_kind);
  int32_t cur;
  if (greedy || spec_rows) {
    cur = target.sampled(row);
  } else {
    target_dist(row, (int)prompt.size() - 1);
    cur = draw(p, philox_uniform(tp.seed, (int64_t)prompt.size(), DrawStream::token));
  }
  if (draft) {
    draft->clear(dseq);
    prefill(*draft, dbatch, dseq, prompt);
  }
  res.prompt_ms = ms_since(t0);
  res.n_prompt = (int)prompt.size();
  return cur;
}

bool Speculation::emit(int32_t t) {
  ++res.n_generated;
  if (on_token && !on_token(t, target, -1)) {
    res.stopped_by_caller = true;
    return false;
  }
  if (!gp.ignore_eos && target.model().is_eog(t)) {
    res.stopped_eog = true;
    return false;
  }
  return res.n_generated < gp.n_predict;
}

// The draft catches up with the target's tokens it has not seen (after a round that kept every draft: the
// last draft and the bonus token) and cur at position n: full batches are stepped here, the rest is left in
// dbatch (cur's row last, with output `last`) for the caller to run.
void Speculation::draft_catch_up(int n, int32_t cur_tok, Output last) {
  const auto toks = target.seq_tokens(seq);
  int have = draft->seq_len(dseq);
  for (; n - have + 1 > dbatch.capacity(); have += dbatch.capacity()) {
    dbatch.clear();
    dbatch.add_sequence(toks.subspan(have, dbatch.capacity()), have, dseq);
    draft->step(dbatch);
  }
  dbatch.clear();
  if (n > have) dbatch.add_sequence(toks.subspan(have, n - have), have, dseq);
  dbatch.add(cur_tok, n, dseq, last);
}

void Speculation::draft_lookup(Round& r) {
  const auto toks = target.seq_tokens(seq);
  history.assign(toks.begin(), toks.end());
  history.push_back(r.cur);
  r.k = lookup(history, sp.lookup_ngram, r.k_max, r.drafts.data());
  std::fill(r.from_model.begin(), r.from_model.begin() + r.k, 0);
  st.from_lookup += r.k;
}

// The whole round queued at once: the draft's steps, each fed the token the one before sampled, and the
// target's verification step, whose rows follow the draft's sequence (Batch::follow): on a GPU the host
// launches everything and reads the results once.
void Speculation::draft_on_device(Round& r) {
  const int n = r.n, k_max = r.k_max;
  const auto t0 = std::chrono::steady_clock::now();
  draft_catch_up(n, r.cur, draft_kind);
  draft->submit(dbatch);
  for (int i = 1; i < k_max; ++i) {
    if (draft->n_queued() == 2) draft->wait();
    dbatch.clear();
    dbatch.add(Batch::kSampled, n + i, dseq, draft_kind);
    draft->submit(dbatch);
  }
  const auto t1 = std::chrono::steady_clock::now();
  const Output v = greedy ? Output::sample : Output::verify;
  batch.clear();
  batch.add(r.cur, n, seq, v);
  for (int i = 0; i < k_max; ++i)
    batch.add(Batch::follow(dseq), n + 1 + i, seq, i + 1 < k_max ? v : Output::sample);
  target.submit(batch);
  while (draft->n_queued() > 0) draft->wait();
  target.wait();
  const auto toks_after = target.seq_tokens(seq);
  for (int i = 0; i < k_max; ++i) r.drafts[i] = toks_after[n + 1 + i];
  std::fill(r.from_model.begin(), r.from_model.begin() + k_max, 1);
  r.k = k_max;
  r.verified = true;
  st.draft_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
  st.verify_ms += ms_since(t1);
}

// The draft proposes one token per step. Greedy: the step's own sampler picks the token (on a GPU nothing
// but the token comes back); sampled: drawn on the host from q, which accept_on_host needs.
void Speculation::draft_on_host(Round& r) {
  const int n = r.n, k_max = r.k_max;
  const auto t0 = std::chrono::steady_clock::now();
  draft_catch_up(n, r.cur, out_kind);
  // Greedy on an asynchronous backend (the GPU): each draft step is queued behind the one before, its
  // token fed on the device, so the device does not wait for the host between draft steps.
  const bool queue = greedy && draft->asynchronous();
  if (queue)
    draft->submit(dbatch);
  else
    draft->step(dbatch);
  int drow = dbatch.size() - 1;
  for (int i = 0; i < k_max; ++i) {
    const int pos = n + i;  // the draft's row drow is the token at pos; it proposes pos + 1
    bool queued_next = false;
    if (queue) {
      if (i + 1 < k_max) {
        dbatch.clear();
        dbatch.add(Batch::kSampled, pos + 1, dseq, out_kind);
        draft->submit(dbatch);
        queued_next = true;
      }
      draft->wait();  // the step of row drow
    }
    if (greedy) {
      // Adaptive: stop when the draft is unsure (its sampler's probability of its argmax).
      if (sp.p_min > 0 && std::exp(draft->logprob(drow)) < sp.p_min) {
        if (queued_next) {  // the step queued past the stop: finish it and forget its row
          draft->wait();
          draft->crop(dseq, draft->seq_len(dseq) - 1);
        }
        break;
      }
      r.drafts[i] = draft->sampled(drow);
    } else {
      Dist& qi = q[i];
      qi.n = sample_distribution(dp, draft->logits(drow).data(), n_sample,
                                 penalty_window(dp, draft->seq_tokens(dseq)), scratch, qi.ids.data(),
                                 qi.probs.data());
      if (sp.p_min > 0 && qi.probs[0] < sp.p_min) break;  // adaptive: the draft is unsure
      r.drafts[i] = draw(qi, philox_uniform(dp.seed, pos + 1, DrawStream::token));
    }
    r.from_model[i] = 1;
    r.k = i + 1;
    if (i + 1 == k_max) break;
    if (!queue) {
      dbatch.clear();
      dbatch.add(r.drafts[i], pos + 1, dseq, out_kind);
      draft->step(dbatch);
    }
    drow = 0;
  }
  st.draft_ms += ms_since(t0);
}

// cur and the k drafts in one target step, every row an output (unless draft_on_device ran it). A draft
// shorter than --draft-min is dropped: one plain step.
void Speculation::verify(Round& r) {
  if (r.k < sp.n_draft_min) r.k = 0;
  const int n = r.n, k = r.k;
  // Whether the target's step runs the acceptance test (accept then compares tokens): greedy, a device
  // round, or with speculative outputs when the drafts are prompt lookups (q a point mass on each; a draft
  // model's q stepped on the host is known on the host only) or there are none.
  r.compare = greedy || r.verified;
  if (spec_rows && !r.compare)
    r.compare = std::none_of(r.from_model.begin(), r.from_model.begin() + k, [](uint8_t f) { return f; });
  if (!r.verified) {
    const auto t0 = std::chrono::steady_clock::now();
    const Output v = r.compare && !greedy ? Output::verify : out_kind;
    const Output last = r.compare ? Output::sample : out_kind;
    batch.clear();
    batch.add(r.cur, n, seq, k > 0 ? v : last);
    for (int i = 0; i < k; ++i) batch.add(r.drafts[i], n + 1 + i, seq, i + 1 < k ? v : last);
    target.step(batch);
    st.verify_ms += ms_since(t0);
  }
  ++res.n_eval;
  if (k > 0) {
    ++st.rounds;
    st.drafted += k;
  } else {
    ++st.plain_steps;
  }
}

// The longest prefix the acceptance test keeps, then the correction or bonus token.
void Speculation::accept(Round& r) {
  if (r.compare) {  // greedy: a point mass on the target's argmax; verify rows: their tokens are the test's
    while (r.a < r.k && target.sampled(r.a) == r.drafts[r.a]) ++r.a;
    r.next = target.sampled(r.a);
  } else {
    accept_on_host(r);
  }
  st.accepted += r.a;
}

// The rejection test from the verification rows' logits: a drafted x is kept with probability
// min(1, p(x) / q(x)); on rejection the token is drawn from normalize(max(0, p - q)).
void Speculation::accept_on_host(Round& r) {
  for (; r.a <= r.k; ++r.a) {
    const int a = r.a, pos = r.n + a;  // row a scored the token at pos: p is for pos + 1
    target_dist(a, pos);
    if (a == r.k) {  // all drafts kept (or none drafted): the target's own token
      r.next = draw(p, philox_uniform(tp.seed, pos + 1, DrawStream::token));
      break;
    }
    const int32_t x = r.drafts[a];
    const bool model = r.from_model[a];
    for (int j = 0; j < p.n; ++j) p_dense[p.ids[j]] = p.probs[j];
    double qx = 1.0;  // prompt lookup: a point mass
    if (model) {
      const Dist& qa = q[a];
      for (int j = 0; j < qa.n; ++j) q_dense[qa.ids[j]] = qa.probs[j];
      qx = q_dense[x];
    }
    const double px = p_dense[x];
    const bool keep = qx > 0 && philox_uniform(tp.seed, pos + 1, DrawStream::accept) * qx < px;
    if (!keep) {
      // The residual max(0, p - q) over p's support (q is a point mass on x for a lookup draft).
      for (int j = 0; j < p.n; ++j) {
        const int32_t id = p.ids[j];
        const double qv = model ? q_dense[id] : (id == x ? 1.0 : 0.0);
        p.probs[j] = (float)std::max(0.0, (double)p.probs[j] - qv);
      }
      r.next = draw(p, philox_uniform(tp.seed, pos + 1, DrawStream::residual));
    }
    for (int j = 0; j < p.n; ++j) p_dense[p.ids[j]] = 0.0f;
    if (model)
      for (int j = 0; j < q[a].n; ++j) q_dense[q[a].ids[j]] = 0.0f;
    if (!keep) break;
  }
}

// The target keeps cur and the first `kept` drafts; the draft at most as much.
void Speculation::rollback(const Round& r, int kept) {
  target.crop(seq, r.n + 1 + kept);
  if (draft) draft->crop(dseq, std::min(draft->seq_len(dseq), r.n + 1 + kept));
}

}  // namespace

void check_draft_compatible(const Model& target, const Model& draft) {
  const ModelInfo &t = target.info(), &d = draft.info();
  if (t.n_vocab != d.n_vocab)
    fail("draft model {}: its vocabulary has {} tokens, the target's {}", d.path, d.n_vocab, t.n_vocab);
  const Tokenizer *tt = target.tokenizer(), *dt = draft.tokenizer();
  if (!tt || !dt) return;
  if (tt->n_vocab() != dt->n_vocab())
    fail("draft model {}: its tokenizer has {} tokens, the target's {}", d.path, dt->n_vocab(),
         tt->n_vocab());
  for (int32_t id = 0; id < tt->n_vocab(); ++id)
    if (tt->token_to_piece(id) != dt->token_to_piece(id))
      fail("draft model {}: token {} is '{}' there and '{}' in the target: the vocabularies differ", d.path,
           id, dt->token_to_piece(id), tt->token_to_piece(id));
}

GenerateResult generate_speculative(Context& target, Context* draft, std::span<const int32_t> prompt,
                                    const GenerateParams& gp, const SpeculativeParams& sp,
                                    const OnToken& on_token, SpeculativeStats* stats_out) {
  if (!draft && sp.lookup_ngram <= 0)
    fail("speculative decoding needs a draft model or prompt lookup (lookup_ngram > 0)");
  if (sp.n_draft < 1 || sp.n_draft > 64)
    fail("speculative: n_draft = {} is out of range [1, 64]", sp.n_draft);
  if (prompt.empty()) fail("generate: the prompt is empty (at least one token is needed)");
  const int n_ctx = target.params().n_ctx;
  if ((int64_t)prompt.size() >= n_ctx)
    fail("generate: the prompt of {} tokens does not fit in the context of {} tokens (raise n_ctx)",
         prompt.size(), n_ctx);
  if (draft) {
    check_draft_compatible(target.model(), draft->model());
    if (draft->params().n_ctx < n_ctx)
      fail("speculative: the draft's context ({} tokens) is shorter than the target's ({})",
           draft->params().n_ctx, n_ctx);
  }
  // One more row than drafted tokens must fit in a target step; the target must return them all.
  const int K = std::min({sp.n_draft, target.params().n_batch - 1, target.params().n_outputs - 1});
  if (K < 1)
    fail(
        "speculative: the target context needs n_batch and n_outputs of at least 2 (K + 1 rows); it has {} "
        "and {}",
        target.params().n_batch, target.params().n_outputs);

  Speculation s(target, draft, gp, sp, K, (int)prompt.size(), on_token);
  struct Unfollow {
    Context* c;
    ~Unfollow() {
      try {
        if (c) c->follow(nullptr);
      } catch (...) {  // steps still queued after an error: the link stays until the contexts go
      }
    }
  } unfollow{nullptr};
  if (s.device_round) {
    target.follow(draft);
    unfollow.c = &target;
  }

  int32_t cur = s.start(prompt);
  Round r(K);
  if (gp.n_predict > 0 && s.emit(cur)) {
    while (true) {
      const int n = target.seq_len(gp.seq);  // cur goes to position n
      if (n >= n_ctx) {
        s.res.context_full = true;
        break;
      }
      // At most the tokens still wanted (a round's bonus token past them is not delivered) and the room
      // left in the context.
      r.begin(n, cur, std::min({K, gp.n_predict - s.res.n_generated, n_ctx - n - 1}));
      // Draft: prompt lookup first, else the draft model (the whole round on the device where it can).
      if (r.k_max > 0 && sp.lookup_ngram > 0) s.draft_lookup(r);
      if (r.k == 0 && s.device_round && r.k_max >= std::max(1, sp.n_draft_min)) s.draft_on_device(r);
      if (r.k == 0 && r.k_max > 0 && draft) s.draft_on_host(r);
      s.verify(r);
      s.accept(r);
      s.rollback(r, r.a);
      // Deliver the accepted drafts and the target's token.
      int i = 0;
      while (i < r.a && s.emit(r.drafts[i])) ++i;
      if (i < r.a) {  // generation ended at drafts[i], already in the cache: as generate(), the last token
        s.rollback(r, i);  // is not in the sequence
        break;
      }
      if (!s.emit(r.next)) break;
      cur = r.next;
    }
  }
  s.res.eval_ms = s.st.verify_ms + s.st.draft_ms;
  if (stats_out) *stats_out = s.st;
  return s.res;
}

}  // namespace ultra
