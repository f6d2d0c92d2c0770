// The test-only hooks of engine/testing.h: KV poisoning, and a backend wrapper that defers each step to its
// completion the way a GPU backend runs it.
#include "engine/testing.h"

#include <algorithm>

#include "core/error.h"
#include "engine/access.h"
#include "engine/context_impl.h"

namespace ultra {

void testing::poison_kv_past_length(Context& ctx, int seq) {
  Context::Impl& c = detail::impl(ctx);
  c.seqs.check(seq, "poison_kv_past_length");
  c.queue.check_idle("poison_kv_past_length");
  c.be->poison_kv(seq, c.seqs.len(seq));
}

namespace {

// testing::defer_steps: the wrapped backend runs each step when it is completed. The logit rules are the
// step's (rules_in_step, as on the GPU): the masks are copied at submit, the engine reuses its buffer.
class DeferredBackend final : public Backend {
 public:
  DeferredBackend(std::unique_ptr<Backend> inner, int n_batch, int n_outputs, int n_sample)
      : inner_(std::move(inner)),
        tok_(n_batch),
        prev_(n_outputs, -1),
        n_words_((size_t)(n_sample + 31) / 32) {
    for (Q& q : q_) {
      q.job_copy.resize(n_outputs);
      q.rule_copy.resize(n_outputs);
      q.masks.resize((size_t)n_outputs * n_words_);
    }
  }
  const char* name() const override { return inner_->name(); }
  std::string description() const override { return inner_->description(); }
  std::span<const BackendStat> stats() const override { return inner_->stats(); }
  Footprint footprint() const override { return inner_->footprint(); }
  void step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results, TokenLogprob* top,
            StepStats& stats) override {
    submit(rows, jobs, n_jobs, results, top, stats);
    complete(stats);
  }
  bool asynchronous() const override { return true; }
  void submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
              TokenLogprob* top, StepStats&) override {
    if (n_ >= 2) fail("deferred backend: two steps are outstanding already");
    Q& q = q_[(head_ + n_) % 2];
    q.rows = rows;
    q.n_jobs = n_jobs;
    q.results = results;
    q.top = top;
    auto keep_mask = [&](const uint32_t* allow, int k) -> const uint32_t* {
      if (!allow) return nullptr;
      uint32_t* m = q.masks.data() + (size_t)k * n_words_;
      std::copy_n(allow, n_words_, m);
      return m;
    };
    for (int j = 0; j < n_jobs; ++j) {
      q.job_copy[j] = jobs[j];
      q.job_copy[j].allow = keep_mask(jobs[j].allow, jobs[j].out);
    }
    q.n_rules = n_rules_;
    for (int i = 0; i < n_rules_; ++i) {
      q.rule_copy[i] = rules_[i];
      q.rule_copy[i].allow = keep_mask(rules_[i].allow, rules_[i].out);
    }
    n_rules_ = 0;
    ++n_;
  }
  bool rules_in_step() const override { return true; }
  void logits_rules(const LogitsRule* rules, int n) override {
    rules_ = rules;
    n_rules_ = n;
  }
  void complete(StepStats& stats) override {
    if (n_ == 0) fail("deferred backend: no step is outstanding");
    Q& q = q_[head_];
    head_ = (head_ + 1) % 2;
    --n_;
    for (int i = 0; i < q.rows.n; ++i) {
      const int32_t t = q.rows.token[i];
      switch (q.rows.feed ? q.rows.feed[i] : TokenFeed::id) {
        case TokenFeed::id:
          tok_[i] = t;
          break;
        case TokenFeed::prev_output:
          tok_[i] = prev_[t];
          break;
        case TokenFeed::linked_seq:
          tok_[i] = link_src_.host_tokens[(size_t)t * link_src_.n_ctx + q.rows.pos[i]];
          break;
        case TokenFeed::linked_output:
          tok_[i] = link_->prev_[t];
          break;
      }
      if (tok_[i] < 0) fail("deferred backend: row {}: a fed token is not known yet", i);
    }
    q.rows.token = tok_.data();
    q.rows.feed = nullptr;
    inner_->step(q.rows, q.job_copy.data(), q.n_jobs, q.results, q.top, stats);
    for (int i = 0; i < q.n_rules; ++i)
      inner_->apply_rules(q.rule_copy[i].out, *q.rule_copy[i].params, q.rule_copy[i].allow);
    std::fill(prev_.begin(), prev_.end(), -1);
    for (int j = 0; j < q.n_jobs; ++j) prev_[q.job_copy[j].out] = q.results[j].token;
  }
  const float* logits(int k) override { return inner_->logits(k); }
  bool ranks_in_step() const override { return inner_->ranks_in_step(); }
  void poison_kv(int seq, int from) override { inner_->poison_kv(seq, from); }
  void copy_kv(int from, int to, int n) override { inner_->copy_kv(from, to, n); }
  // A deferred source's state is read when this backend's step runs: its last outputs, and its context's
  // host tokens (the engine checks that they are known by then).
  bool link(const LinkSource& source) override {
    link_ = dynamic_cast<DeferredBackend*>(source.backend);
    link_src_ = source;
    return link_ != nullptr;
  }

 private:
  DeferredBackend* link_ = nullptr;
  LinkSource link_src_;
  struct Q {
    StepRows rows;
    int n_jobs = 0;
    SampleResult* results = nullptr;
    TokenLogprob* top = nullptr;
    std::vector<SampleJob> job_copy;    // [n_outputs] the jobs, their masks in `masks`
    std::vector<LogitsRule> rule_copy;  // [n_outputs] the logits rows' rules, likewise
    int n_rules = 0;
    std::vector<uint32_t> masks;  // [n_outputs, n_words] by output row
  };
  std::unique_ptr<Backend> inner_;
  std::vector<int32_t> tok_, prev_;
  size_t n_words_;
  const LogitsRule* rules_ = nullptr;  // of the next submit
  int n_rules_ = 0;
  Q q_[2]{};
  int head_ = 0, n_ = 0;
};

}  // namespace

void testing::defer_steps(Context& ctx) {
  Context::Impl& c = detail::impl(ctx);
  c.queue.check_idle("defer_steps");
  c.be = std::make_unique<DeferredBackend>(std::move(c.be), c.p.n_batch, c.p.n_outputs, c.n_sample);
}

}  // namespace ultra
