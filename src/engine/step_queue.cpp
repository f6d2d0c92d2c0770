#include "engine/step_queue.h"

#include "core/error.h"

namespace ultra {

StepRows StepRecord::rows() const {
  StepRows r;
  r.n = n;
  r.token = tok.data();
  r.feed = feed.data();
  r.pos = pos.data();
  r.seq = seq.data();
  r.n_out = n_out;
  r.out_row = out_row.data();
  return r;
}

StepQueue::StepQueue(int n_batch, int n_outputs) {
  for (StepRecord& r : rec_) {
    r.tok = Buffer<int32_t>(n_batch);
    r.pos = Buffer<int32_t>(n_batch);
    r.seq = Buffer<int32_t>(n_batch);
    r.feed = Buffer<TokenFeed>(n_batch);
    r.out_row = Buffer<int32_t>(n_outputs);
    r.row_out = Buffer<int32_t>(n_batch);
    r.row_job = Buffer<int32_t>(n_batch);
    r.link_seq = Buffer<int32_t>(n_batch);
    r.jobs.resize(n_outputs);
    r.results.resize(n_outputs);
    r.top = Buffer<TokenLogprob>((size_t)n_outputs * SamplingParams::kMaxProbs);
  }
}

size_t StepQueue::bytes(int n_batch, int n_outputs) {
  const size_t rec = 6 * (size_t)n_batch * sizeof(int32_t) + (size_t)n_batch * sizeof(TokenFeed) +
                     (size_t)n_outputs * sizeof(int32_t) +
                     (size_t)n_outputs * (sizeof(SampleJob) + sizeof(SampleResult)) +
                     (size_t)n_outputs * SamplingParams::kMaxProbs * sizeof(TokenLogprob);
  return kRecords * rec;
}

void StepQueue::check_idle(const char* what) const {
  if (n_queued_ > 0)
    fail("{}: {} submitted step{} still queued (wait() for {} first)", what, n_queued_,
         n_queued_ == 1 ? " is" : "s are", n_queued_ == 1 ? "it" : "them");
}

void StepQueue::push() {
  next_ = (next_ + 1) % kRecords;
  ++n_queued_;
}

void StepQueue::pop() {
  shown_ = oldest_index();
  --n_queued_;
}

int StepQueue::job_of(int row, const char* what) const {
  const StepRecord* r = shown();
  if (!r || row < 0 || row >= r->n || r->row_job[row] < 0)
    fail("{}: row {} of the last step did not ask for a sampled token", what, row);
  return r->row_job[row];
}

LastSampled::LastSampled(int n_slots)
    : state_(n_slots, kNone), token_(n_slots, -1), rec_(n_slots, -1), out_(n_slots, -1) {}

size_t LastSampled::bytes(int n_slots) {
  return (size_t)n_slots * (sizeof(State) + sizeof(int32_t) + 2 * sizeof(int));
}

void LastSampled::finish(const StepRecord& r, int rec) {
  for (int i = 0; i < r.n; ++i) {
    const int s = r.seq[i];
    token_[s] = r.row_job[i] >= 0 ? r.results[r.row_job[i]].token : -1;
    if (state_[s] == kQueued && rec_[s] == rec) state_[s] = kKnown;
  }
}

}  // namespace ultra
