// The server's scheduler: one thread owns the Context and runs continuous batching over its KV slots.
//
// Requests wait in a bounded queue; each admitted request holds one KV slot until it finishes. Every
// iteration is one Context::step with one decode row per generating sequence plus prefill chunks of newly
// admitted prompts (at most n_batch rows in all, decodes first, so running streams keep flowing while a
// long prompt is prefilled). Each sequence samples with its own request's settings (set_sampling).
//
// A request stops on max_tokens ("length"), a full context ("length"), an end-of-generation token or a stop
// string ("stop"), or cancellation (the client went away: its slot is freed before the next step). Text is
// handed to the HTTP thread as it becomes final: text that could be the beginning of a stop string is held
// back until it is known not to be, so a stop string never leaks partially into a stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ultra/context.h"
#include "ultra/model.h"

namespace ultra::server {

// The log-probability of one generated token and the best alternatives (OpenAI's logprobs).
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;  // the request's top_logprobs best, best first
  size_t offset = 0;              // where the token's text starts in the completion's text (bytes)
};

// One generation request and its results, shared between an HTTP thread and the scheduler.
struct GenRequest {
  // --- input (set before submit, read-only afterwards) ---
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Report each token's log-probability (sampling.n_probs >= 1 then; it is the number of alternatives
  // computed) and n_top of the alternatives.
  bool logprobs = false;
  int n_top = 0;
  bool cache_prompt = true;   // may reuse a slot's cached prefix of the prompt (llama.cpp's cache_prompt)
  std::string grammar;        // GBNF the completion must follow (Context::set_grammar); "" for none
  bool keep_special = false;  // the text keeps control tokens' text (tool-call markers such as [TOOL_CALLS])
  // A lazy grammar (tool_choice "auto"): once the generated text ends with lazy_trigger at a token boundary,
  // lazy_grammar (GBNF for what follows) constrains the rest; a trigger with more text after it in the same
  // token leaves the output free. Only without `grammar`.
  std::string lazy_trigger;
  std::string lazy_grammar;
  // n > 1: the other choices of the same prompt (their own settings and seeds). They are admitted with this
  // request, each into a slot of its own; this one prefills the prompt but its last token, which is then
  // copied to theirs (Context::copy_seq), and each prefills only the last token (its own first sample).
  // Scheduler::submit splits a group larger than the slots into groups that fit.
  std::vector<std::shared_ptr<GenRequest>> forks;

  // --- output, guarded by m ---
  std::mutex m;
  std::condition_variable cv;
  std::string text;  // final text not yet taken by the consumer
  // Log-probabilities of the tokens of the final text not yet taken by the consumer (one per generated
  // token but the end-of-generation one; tokens whose text lies wholly in a stop string are left out).
  std::vector<TokenLogprobs> logprobs_out;
  bool done = false;
  std::string finish_reason;  // "stop", "length" or "cancelled"
  std::string error;          // non-empty: the step failed
  int n_completion = 0;       // tokens generated
  int n_cached = 0;           // prompt tokens found in the slot's cache (not prefilled)

  // The HTTP layer's wake-up (guarded by m): called with m held after every change above; it must not
  // block (it posts to the I/O thread).
  std::function<void()> on_update;
  void notify() {  // with m held
    cv.notify_all();
    if (on_update) on_update();
  }

  std::atomic<bool> cancelled{false};               // set by the HTTP side when the client is gone
  std::chrono::steady_clock::time_point submitted;  // set by submit()

  // Waits until there is text or the request is done (or timeout); moves the text (and, when lp is given,
  // the log-probabilities that came with it) out. Returns true when the request is done (then `out` holds
  // everything that was left).
  bool wait_text(std::string& out, int timeout_ms, std::vector<TokenLogprobs>* lp = nullptr);
};

struct SchedulerStats {
  std::atomic<int64_t> requests_total{0};  // requests admitted to the queue
  std::atomic<int64_t> prompt_tokens_total{0};
  std::atomic<int64_t> prompt_tokens_cached_total{0};  // of those, found in a slot's cache
  std::atomic<int64_t> prompt_tokens_shared_total{0};  // of those, copied from another choice's slot (n > 1)
  std::atomic<int64_t> prompt_tokens_prefilled_total{0};  // prompt tokens run through the model
  std::atomic<int64_t> generated_tokens_total{0};
  std::atomic<int64_t> steps_total{0};
  std::atomic<int> queue_depth{0};
  std::atomic<int> busy_slots{0};
  // Time to first token (from submit() to the first sampled token), a Prometheus histogram: the count of
  // requests at or under each bound (cumulative), the count of all and the sum of the times.
  static constexpr double kTtftBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  static constexpr size_t kTtftBuckets = std::size(kTtftBounds);
  std::atomic<int64_t> ttft_le[kTtftBuckets] = {};
  std::atomic<int64_t> ttft_count{0};
  std::atomic<int64_t> ttft_sum_us{0};
  void observe_ttft(double seconds);
};

class Scheduler {
 public:
  // Creates the context (params.n_slots = the number of parallel sequences) and starts the thread.
  // on_fatal: called on the scheduler's thread when a step of a model split over ranks (--tp) fails with
  // its ranks out of step (Context::ranks_in_step(): a rank stopped answering or died; no later step can
  // run); the running requests have then ended with the error, the queued ones are cancelled and the
  // scheduler takes no more. A step that fails with the ranks in step ends its requests with the error and
  // the scheduler goes on, as with one process.
  Scheduler(const Model& model, const ContextParams& params, int max_queue,
            std::function<void(const std::string&)> on_fatal = {});
  ~Scheduler();  // shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (with its forks: one queue entry per group of at most n_slots requests); false when
  // the queue has no room for them or the scheduler is shutting down (then nothing was queued).
  bool submit(const std::shared_ptr<GenRequest>& req);
  // Cancels every queued and active request (they finish with "cancelled") and joins the thread.
  void shutdown();

  int n_ctx() const { return n_ctx_; }
  int n_slots() const { return n_slots_; }
  int n_sample_vocab() const { return n_sample_; }
  const Model& model() const { return model_; }
  const SchedulerStats& stats() const { return stats_; }
  std::vector<std::string> warnings() const { return warnings_; }

 private:
  struct Slot;
  void run();
  void admit();
  void start(Slot& s, std::shared_ptr<GenRequest> req, size_t prefix);
  void share_prompts();
  static void abandon(GenRequest& req);  // done, "cancelled", with its forks
  void on_token(Slot& s, int32_t tok, int row);
  static constexpr size_t kMaxLazyPiece = 256;  // bytes of a token's text the lazy trigger's watch keeps
  void watch_lazy_trigger(Slot& s, int seq, std::string_view piece);
  void release_logprobs(Slot& s, bool all);  // with the request's m held
  void deliver(Slot& s, const std::string& out, bool all);
  void finish(Slot& s, const char* reason, const std::string& error = {});

  Model model_;
  std::unique_ptr<Context> ctx_;
  int n_ctx_ = 0, n_slots_ = 0, n_batch_ = 0, n_sample_ = 0;
  size_t max_queue_;
  std::function<void(const std::string&)> on_fatal_;
  std::vector<std::string> warnings_;

  std::mutex qm_;
  std::condition_variable qcv_;
  std::deque<std::shared_ptr<GenRequest>> queue_;
  bool stopping_ = false;

  std::vector<Slot> slots_;
  uint64_t n_admitted_ = 0;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace ultra::server
