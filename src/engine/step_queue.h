// The host side of a context's steps (context.h, "Queued steps"): a record of each step handed to the
// backend, up to two queued and the last one waited for, whose results the accessors read; and what
// Batch::kSampled means for each sequence while its last sample may still be on the device.
// Sized once at construction; nothing here allocates after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "engine/backend.h"

namespace ultra {

// One step, host side: its rows as staged for the backend, and its results.
struct StepRecord {
  Buffer<int32_t> tok, pos, seq;      // [n_batch] rows (token ids, or what feed says)
  Buffer<TokenFeed> feed;             // [n_batch] where each token comes from (TokenFeed::id once known)
  Buffer<int32_t> out_row;            // [n_outputs] rows with an output
  Buffer<int32_t> row_out;            // [n_batch] output index of a row, or -1
  Buffer<int32_t> row_job;            // [n_batch] sample job of a row, or -1
  Buffer<int32_t> link_seq;           // [n_batch] the followed sequence of a Batch::follow row, or -1
  bool reads_source = false;          // some row reads the followed context's device state
  bool completed = false;             // queued, and completed already (Context::Impl::complete_for_masks)
  std::vector<SampleJob> jobs;        // [n_outputs]
  std::vector<SampleResult> results;  // [n_outputs]
  Buffer<TokenLogprob> top;           // [n_outputs, kMaxProbs]
  int n = 0, n_out = 0, n_jobs = 0;

  // The rows as the backend takes them (pointers into this record).
  StepRows rows() const;
};

// Three records used in turn: up to two queued steps and the last one waited for.
class StepQueue {
 public:
  static constexpr int kRecords = 3;

  StepQueue() = default;
  StepQueue(int n_batch, int n_outputs);
  static size_t bytes(int n_batch, int n_outputs);

  int n_queued() const { return n_queued_; }
  // Throws "<what>: N submitted steps are still queued" unless none is.
  void check_idle(const char* what) const;

  // The record the next submit fills, and its index.
  int next_index() const { return next_; }
  StepRecord& next() { return rec_[next_]; }
  // The record filled has been handed to the backend: it is queued.
  void push();
  // The index of the step submitted last.
  int last_index() const { return (next_ + kRecords - 1) % kRecords; }
  // The oldest queued step (n_queued() > 0), and waiting for it: its results become the ones shown.
  int oldest_index() const { return (next_ - n_queued_ + kRecords) % kRecords; }
  void pop();
  StepRecord& at(int i) { return rec_[i]; }

  // The last step waited for (null before the first).
  const StepRecord* shown() const { return shown_ >= 0 ? &rec_[shown_] : nullptr; }
  // The sample job of a row of the shown step; throws "<what>: row r of the last step did not ask for a
  // sampled token" when it has none.
  int job_of(int row, const char* what) const;

 private:
  StepRecord rec_[kRecords];
  int next_ = 0;      // the record the next submit fills
  int n_queued_ = 0;  // submitted, not waited for: records next_ - n_queued_ .. next_ - 1 (mod kRecords)
  int shown_ = -1;    // the record of the last step waited for (-1: none yet)
};

// What Batch::kSampled means for each sequence: nothing (the last step that included it did not sample its
// last row, or it was cropped), a token the host knows, or output k of a queued step.
class LastSampled {
 public:
  LastSampled() = default;
  explicit LastSampled(int n_slots);
  static size_t bytes(int n_slots);

  bool any(int s) const { return state_[s] != kNone; }     // kSampled stands for some token
  bool known(int s) const { return state_[s] == kKnown; }  // ... which the host knows: token(s)
  int32_t token(int s) const { return token_[s]; }
  int record(int s) const { return rec_[s]; }  // ... else output output(s) of the queued step record(s)
  int output(int s) const { return out_[s]; }

  // The step in record rec samples sequence s's next token, as its output out.
  void queue(int s, int rec, int out) {
    state_[s] = kQueued;
    rec_[s] = rec;
    out_[s] = out;
  }
  void forget(int s) { state_[s] = kNone; }
  // The step in record rec has finished: its rows' samples are known on the host.
  void finish(const StepRecord& r, int rec);

 private:
  enum State : uint8_t { kNone, kKnown, kQueued };
  std::vector<State> state_;    // [n_slots]
  std::vector<int32_t> token_;  // [n_slots] the last token sampled (kKnown)
  std::vector<int> rec_, out_;  // [n_slots] its step and output (kQueued)
};

}  // namespace ultra
