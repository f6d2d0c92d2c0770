// Speculative decoding on top of Context::step (include/ultra/speculative.h). The distributions p (target)
// and q (draft) come from the sampler's own filtered distribution (sampling/sampler.h), computed on the
// host from each row's logits with the sequence's settings and penalty window, so that the draws and the
// acceptance test follow exactly the function plain sampling uses: a greedy sampler's distribution is the
// argmax with probability 1, which makes the same acceptance rule keep exactly the target's greedy tokens.
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

// The sampler's draw (draw_index) from the kept ids and their probabilities with the uniform u.
int32_t draw(const int32_t* ids, const float* p, int n, double u) {
  return ids[draw_index(p, n, u)];
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
  using clock = std::chrono::steady_clock;
  if (!draft && sp.lookup_ngram <= 0)
    fail("speculative decoding needs a draft model or prompt lookup (lookup_ngram > 0)");
  if (sp.n_draft < 1 || sp.n_draft > 64)
    fail("speculative: n_draft = {} is out of range [1, 64]", sp.n_draft);
  if (prompt.empty()) fail("generate: the prompt is empty (at least one token is needed)");
  const int seq = gp.seq, dseq = sp.draft_seq;
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

  const SamplingParams& tp = target.sampling(seq);
  const bool greedy = !(tp.temperature > 0.0f);  // the samplers' greedy shortcut
  SamplingParams dp = tp;                        // the draft samples with the same settings and its own key
  dp.seed ^= kDraftSeedMix;
  // Greedy rounds sample inside the steps (Output::sample: the argmax, with the penalties; the draft's
  // probability of it for --draft-p-min), so only tokens leave the device; sampled rounds need the logits
  // of every row on the host for the rejection test.
  //
  // On a backend with speculative outputs (the GPU), sampled rounds also keep everything on the device: the
  // draft's steps are Output::propose rows (the device keeps each q), the target's verification rows
  // Output::verify (the rejection test and the residual draw run in its sampler), so their tokens compare
  // with the drafts exactly as greedy ones do. That needs top_k in [1, 1024] (the kept set in shared memory).
  const int n_sample = target.n_sample_vocab();
  const bool spec_rows = !greedy && target.speculative_outputs() &&
                         (!draft || draft->speculative_outputs()) && tp.top_k >= 1 &&
                         tp.top_k <= SamplingParams::kMaxSpeculativeTopK && tp.top_k < n_sample;
  const Output out_kind = greedy ? Output::sample : Output::logits;
  const Output draft_kind = greedy ? Output::sample : Output::propose;        // device rounds
  const Output first_kind = greedy || spec_rows ? Output::sample : out_kind;  // the prompt's last row
  if ((greedy || spec_rows) && draft) {
    SamplingParams g = dp;
    g.n_probs = greedy && sp.p_min > 0 ? 1 : 0;
    draft->set_sampling(dseq, g);
  }
  // Rounds of fixed length on asynchronous backends (the GPU) run as one queued round: the target follows
  // the draft's sequence for the round's duration.
  const bool device_round =
      (greedy || spec_rows) && draft && sp.p_min <= 0 && draft->asynchronous() && target.asynchronous();

  struct Unfollow {
    Context* c;
    ~Unfollow() {
      try {
        if (c) c->follow(nullptr);
      } catch (...) {  // steps still queued after an error: the link stays until the contexts go
      }
    }
  } unfollow{nullptr};
  if (device_round) {
    target.follow(draft);
    unfollow.c = &target;
  }
  const int V = target.model().info().n_vocab;
  SamplerScratch scratch(V);
  Dist p(V);
  std::vector<Dist> q;  // [K] the draft's distribution of each proposal
  if (draft) q.assign(K, Dist(V));
  std::vector<float> q_dense(V, 0.0f), p_dense(V, 0.0f);
  std::vector<int32_t> drafts(K), history;
  std::vector<uint8_t> from_model(K);
  history.reserve(n_ctx);
  Batch batch(std::max(K + 1, std::min(target.params().n_batch, (int)prompt.size())));
  Batch dbatch(draft ? draft->params().n_batch : 1);

  SpeculativeStats st;
  GenerateResult r;
  auto target_dist = [&](int row, int pos) {  // p for the token after position pos (row of the last step)
    const auto toks = target.seq_tokens(seq).first(pos + 1);
    p.n = sample_distribution(tp, target.logits(row).data(), n_sample, penalty_window(tp, toks), scratch,
                              p.ids.data(), p.probs.data());
  };

  // Prompt: both contexts, the target's last row gives the first token.
  auto t0 = clock::now();
  target.clear(seq);
  int row = prefill(target, batch, seq, prompt, first_kind);
  int32_t cur;
  if (greedy || spec_rows) {
    cur = target.sampled(row);
  } else {
    target_dist(row, (int)prompt.size() - 1);
    cur = draw(p.ids.data(), p.probs.data(), p.n,
               philox_uniform(tp.seed, (int64_t)prompt.size(), DrawStream::token));
  }
  if (draft) {
    draft->clear(dseq);
    prefill(*draft, dbatch, dseq, prompt);
  }
  r.prompt_ms = ms_since(t0);
  r.n_prompt = (int)prompt.size();

  // Delivers a token; false when generation ends.
  auto emit = [&](int32_t t) {
    ++r.n_generated;
    if (on_token && !on_token(t, target, -1)) {
      r.stopped_by_caller = true;
      return false;
    }
    if (!gp.ignore_eos && target.model().is_eog(t)) {
      r.stopped_eog = true;
      return false;
    }
    return r.n_generated < gp.n_predict;
  };
  if (gp.n_predict <= 0 || !emit(cur)) {
    if (stats_out) *stats_out = st;
    return r;
  }

  // The draft catches up with the target's tokens it has not seen (after a round that kept every draft: the
  // last draft and the bonus token) and cur at position n: full batches are stepped here, the rest is left in
  // dbatch (cur's row last, with output `last`) for the caller to run.
  auto draft_catch_up = [&](int n, int32_t cur_tok, Output last) {
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
  };

  while (true) {
    const int n = target.seq_len(seq);  // cur goes to position n
    if (n >= n_ctx) {
      r.context_full = true;
      break;
    }
    // At most the tokens still wanted (a round's bonus token past them is not delivered) and the room left
    // in the context.
    const int k_max = std::min({K, gp.n_predict - r.n_generated, n_ctx - n - 1});
    int k = 0;
    // 1. Draft: prompt lookup first, else the draft model.
    if (k_max > 0 && sp.lookup_ngram > 0) {
      const auto toks = target.seq_tokens(seq);
      history.assign(toks.begin(), toks.end());
      history.push_back(cur);
      k = lookup(history, sp.lookup_ngram, k_max, drafts.data());
      std::fill(from_model.begin(), from_model.begin() + k, 0);
      st.from_lookup += k;
    }
    bool verified = false;  // the verification step ran with the draft steps (device round)
    if (k == 0 && device_round && k_max >= std::max(1, sp.n_draft_min)) {
      // The whole round queued at once: the draft's steps, each fed the token the one before sampled, and
      // the target's verification step, whose rows follow the draft's sequence (Batch::follow): on a GPU
      // the host launches everything and reads the results once.
      t0 = clock::now();
      draft_catch_up(n, cur, draft_kind);
      draft->submit(dbatch);
      for (int i = 1; i < k_max; ++i) {
        if (draft->n_queued() == 2) draft->wait();
        dbatch.clear();
        dbatch.add(Batch::kSampled, n + i, dseq, draft_kind);
        draft->submit(dbatch);
      }
      const auto t1 = clock::now();
      const Output v = greedy ? Output::sample : Output::verify;
      batch.clear();
      batch.add(cur, n, seq, v);
      for (int i = 0; i < k_max; ++i)
        batch.add(Batch::follow(dseq), n + 1 + i, seq, i + 1 < k_max ? v : Output::sample);
      target.submit(batch);
      while (draft->n_queued() > 0) draft->wait();
      target.wait();
      const auto toks_after = target.seq_tokens(seq);
      for (int i = 0; i < k_max; ++i) drafts[i] = toks_after[n + 1 + i];
      std::fill(from_model.begin(), from_model.begin() + k_max, 1);
      k = k_max;
      verified = true;
      st.draft_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      st.verify_ms += ms_since(t1);
    }
    if (k == 0 && k_max > 0 && draft) {
      t0 = clock::now();
      // Then it proposes one token per step. Greedy: the step's own sampler picks the token (on a GPU nothing
      // but the token comes back).
      draft_catch_up(n, cur, out_kind);
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
          drafts[i] = draft->sampled(drow);
        } else {
          Dist& qi = q[i];
          qi.n = sample_distribution(dp, draft->logits(drow).data(), n_sample,
                                     penalty_window(dp, draft->seq_tokens(dseq)), scratch, qi.ids.data(),
                                     qi.probs.data());
          if (sp.p_min > 0 && qi.probs[0] < sp.p_min) break;  // adaptive: the draft is unsure
          drafts[i] =
              draw(qi.ids.data(), qi.probs.data(), qi.n, philox_uniform(dp.seed, pos + 1, DrawStream::token));
        }
        from_model[i] = 1;
        k = i + 1;
        if (i + 1 == k_max) break;
        if (!queue) {
          dbatch.clear();
          dbatch.add(drafts[i], pos + 1, dseq, out_kind);
          draft->step(dbatch);
        }
        drow = 0;
      }
      st.draft_ms += ms_since(t0);
    }
    if (k < sp.n_draft_min) k = 0;  // too short to be worth a verification: one plain step

    // 2. Verify: cur and the k drafts in one target step, every row an output.
    // Whether the target's step runs the acceptance test (step 3 then compares tokens): greedy, a device
    // round, or with speculative outputs when the drafts are prompt lookups (q a point mass on each; a draft
    // model's q stepped on the host is known on the host only) or there are none.
    bool compare = greedy || verified;
    if (spec_rows && !compare)
      compare = std::none_of(from_model.begin(), from_model.begin() + k, [](uint8_t f) { return f; });
    if (!verified) {
      t0 = clock::now();
      const Output v = compare && !greedy ? Output::verify : out_kind;
      const Output last = compare ? Output::sample : out_kind;
      batch.clear();
      batch.add(cur, n, seq, k > 0 ? v : last);
      for (int i = 0; i < k; ++i) batch.add(drafts[i], n + 1 + i, seq, i + 1 < k ? v : last);
      target.step(batch);
      st.verify_ms += ms_since(t0);
    }
    ++r.n_eval;
    if (k > 0) {
      ++st.rounds;
      st.drafted += k;
    } else {
      ++st.plain_steps;
    }

    // 3. Accept the longest prefix the rejection test keeps, then the correction or bonus token.
    int a = 0;
    int32_t next = -1;
    if (compare) {  // greedy: a point mass on the target's argmax; verify rows: their tokens are the test's
      while (a < k && target.sampled(a) == drafts[a]) ++a;
      next = target.sampled(a);
    }
    for (; !compare && a <= k; ++a) {
      const int pos = n + a;  // row a scored the token at pos: p is for pos + 1
      target_dist(a, pos);
      if (a == k) {  // all drafts kept (or none drafted): the target's own token
        next = draw(p.ids.data(), p.probs.data(), p.n, philox_uniform(tp.seed, pos + 1, DrawStream::token));
        break;
      }
      const int32_t x = drafts[a];
      for (int j = 0; j < p.n; ++j) p_dense[p.ids[j]] = p.probs[j];
      double qx = 1.0;  // prompt lookup: a point mass
      if (from_model[a]) {
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
          const double qv = from_model[a] ? q_dense[id] : (id == x ? 1.0 : 0.0);
          p.probs[j] = (float)std::max(0.0, (double)p.probs[j] - qv);
        }
        next =
            draw(p.ids.data(), p.probs.data(), p.n, philox_uniform(tp.seed, pos + 1, DrawStream::residual));
      }
      for (int j = 0; j < p.n; ++j) p_dense[p.ids[j]] = 0.0f;
      if (from_model[a])
        for (int j = 0; j < q[a].n; ++j) q_dense[q[a].ids[j]] = 0.0f;
      if (!keep) break;
    }
    st.accepted += a;

    // 4. Roll back: the target keeps cur and the accepted drafts; the draft at most as much.
    target.crop(seq, n + 1 + a);
    if (draft) draft->crop(dseq, std::min(draft->seq_len(dseq), n + 1 + a));
    int i = 0;
    while (i < a && emit(drafts[i])) ++i;
    if (i < a) {  // generation ended at drafts[i], already in the cache: as generate(), the last token is not
      target.crop(seq, n + 1 + i);  // in the sequence
      if (draft) draft->crop(dseq, std::min(draft->seq_len(dseq), n + 1 + i));
      break;
    }
    if (!emit(next)) break;
    cur = next;
  }
  r.eval_ms = st.verify_ms + st.draft_ms;
  if (stats_out) *stats_out = st;
  return r;
}

}  // namespace ultra
