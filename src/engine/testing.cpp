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

// testing::defer_steps: the wrapped backend runs each step when it is completed.
class DeferredBackend final : public Backend {
 public:
  DeferredBackend(std::unique_ptr<Backend> inner, int n_batch, int n_outputs)
      : inner_(std::move(inner)), tok_(n_batch), prev_(n_outputs, -1) {}
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
    q_[(head_ + n_) % 2] = {rows, jobs, n_jobs, results, top};
    ++n_;
  }
  void complete(StepStats& stats) override {
    if (n_ == 0) fail("deferred backend: no step is outstanding");
    Q q = q_[head_];
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
    inner_->step(q.rows, q.jobs, q.n_jobs, q.results, q.top, stats);
    std::fill(prev_.begin(), prev_.end(), -1);
    for (int j = 0; j < q.n_jobs; ++j) prev_[q.jobs[j].out] = q.results[j].token;
  }
  const float* logits(int k) override { return inner_->logits(k); }
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
    const SampleJob* jobs;
    int n_jobs;
    SampleResult* results;
    TokenLogprob* top;
  };
  std::unique_ptr<Backend> inner_;
  std::vector<int32_t> tok_, prev_;
  Q q_[2]{};
  int head_ = 0, n_ = 0;
};

}  // namespace

void testing::defer_steps(Context& ctx) {
  Context::Impl& c = detail::impl(ctx);
  c.queue.check_idle("defer_steps");
  c.be = std::make_unique<DeferredBackend>(std::move(c.be), c.p.n_batch, c.p.n_outputs);
}

}  // namespace ultra
