#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "server/chat.h"
#include "ultra/error.h"

namespace ultra::server {

bool GenRequest::wait_text(std::string& out, int timeout_ms, std::vector<TokenLogprobs>* lp) {
  std::unique_lock lk(m);
  cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return done || !text.empty(); });
  out = std::move(text);
  text.clear();
  if (lp) {
    lp->insert(lp->end(), std::make_move_iterator(logprobs_out.begin()),
               std::make_move_iterator(logprobs_out.end()));
    logprobs_out.clear();
  }
  return done;
}

struct Scheduler::Slot {
  std::shared_ptr<GenRequest> req;  // null: free
  size_t n_prefilled = 0;           // prompt tokens already in the cache
  uint64_t last_used = 0;           // admission stamp (least recently used slots are taken first)
  bool decoding = false;            // the prompt is in; `last` is the token to feed next
  int32_t last = 0;
  std::optional<TextStream> stream;
  std::optional<StopStrings> stops;  // holds back text that could begin a stop string
  int n_gen = 0;
  // logprobs: entries of generated tokens whose text has not been handed over yet; the bytes of text
  // handed over, and the bytes of the generated tokens' pieces so far (the next token's offset).
  std::vector<TokenLogprobs> pending;
  size_t n_emitted = 0, n_piece_bytes = 0;
  // The lazy grammar's watch: armed until the trigger is seen; the text's last bytes (capacity reserved at
  // admission, so the watch allocates nothing per token).
  bool lazy_armed = false;
  std::string lazy_tail;
  // n > 1: this fork waits for the prompt (but its last token) to be prefilled in slot `source` by the
  // request source_req, then copies it (share_prompts); -1: it prefills its prompt itself.
  int source = -1;
  const GenRequest* source_req = nullptr;
};

Scheduler::Scheduler(const Model& model, const ContextParams& params, int max_queue,
                     std::function<void(const std::string&)> on_fatal)
    : model_(model), max_queue_((size_t)std::max(0, max_queue)), on_fatal_(std::move(on_fatal)) {
  if (!model.tokenizer()) throw Error("the model has no tokenizer: the server needs one");
  ctx_ = std::make_unique<Context>(model, params);
  for (const std::string& w : ctx_->warnings()) warnings_.push_back(w);
  n_ctx_ = ctx_->params().n_ctx;
  n_sample_ = ctx_->n_sample_vocab();
  n_slots_ = ctx_->params().n_slots;
  n_batch_ = ctx_->params().n_batch;
  slots_.resize((size_t)n_slots_);
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  shutdown();
}

void SchedulerStats::observe_ttft(double seconds) {
  for (size_t b = 0; b < kTtftBuckets; ++b)
    if (seconds <= kTtftBounds[b]) ++ttft_le[b];
  ttft_sum_us += (int64_t)(seconds * 1e6);
  ++ttft_count;
}

bool Scheduler::submit(const std::shared_ptr<GenRequest>& req) {
  // A request and its forks, in groups of at most n_slots (each admitted at once), led by their first.
  std::vector<std::shared_ptr<GenRequest>> all{req};
  all.insert(all.end(), req->forks.begin(), req->forks.end());
  const size_t group = (size_t)n_slots_;
  const size_t n_groups = (all.size() + group - 1) / group;
  {
    std::lock_guard lk(qm_);
    if (stopping_ || queue_.size() + n_groups > max_queue_) return false;
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < all.size(); i += group) {
      GenRequest& lead = *all[i];
      lead.forks.assign(all.begin() + (ptrdiff_t)i + 1,
                        all.begin() + (ptrdiff_t)std::min(all.size(), i + group));
      for (size_t k = i; k < std::min(all.size(), i + group); ++k) all[k]->submitted = now;
      queue_.push_back(all[i]);
    }
    stats_.queue_depth = (int)queue_.size();
    stats_.requests_total += (int64_t)all.size();
  }
  qcv_.notify_one();
  return true;
}

void Scheduler::shutdown() {
  {
    std::lock_guard lk(qm_);
    stopping_ = true;
  }
  qcv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::abandon(GenRequest& req) {
  const auto end = [](GenRequest& r) {
    std::lock_guard lk(r.m);
    r.done = true;
    r.finish_reason = "cancelled";
    r.notify();
  };
  end(req);
  for (const std::shared_ptr<GenRequest>& f : req.forks) end(*f);
}

// Takes queued requests into free slots (called with qm_ held). Prefix reuse: a request takes the free slot
// whose cache holds the longest prefix of its prompt (ties: the least recently used), the cache is cropped
// there and only the rest is prefilled; at least the prompt's last token is prefilled, for its sample. A
// request with forks waits until there is a free slot for each; its forks take the least recently used
// ones and copy its prompt's KV once it is prefilled (share_prompts).
void Scheduler::admit() {
  while (!queue_.empty()) {
    if (queue_.front()->cancelled) {
      std::shared_ptr<GenRequest> req = std::move(queue_.front());
      queue_.pop_front();
      abandon(*req);
      continue;
    }
    const GenRequest& next = *queue_.front();
    const size_t n_free =
        (size_t)std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.req == nullptr; });
    if (n_free < 1 + next.forks.size()) break;
    Slot* best = nullptr;
    size_t best_prefix = 0;
    for (Slot& s : slots_) {
      if (s.req) continue;
      size_t p = 0;
      if (next.cache_prompt) {
        const std::span<const int32_t> cached = ctx_->seq_tokens((int)(&s - slots_.data()));
        while (p < cached.size() && p + 1 < next.prompt.size() && cached[p] == next.prompt[p]) ++p;
      }
      if (!best || p > best_prefix || (p == best_prefix && s.last_used < best->last_used)) {
        best = &s;
        best_prefix = p;
      }
    }
    if (!best) break;
    Slot& s = *best;
    std::shared_ptr<GenRequest> req = std::move(queue_.front());
    queue_.pop_front();
    const GenRequest* lead = req.get();
    start(s, std::move(req), best_prefix);
    for (const std::shared_ptr<GenRequest>& f : lead->forks) {
      Slot* t = nullptr;
      for (Slot& u : slots_)
        if (!u.req && (!t || u.last_used < t->last_used)) t = &u;
      start(*t, f, 0);
      if (t->req && f->prompt.size() > 1 && f->prompt == lead->prompt) {
        t->source = (int)(&s - slots_.data());
        t->source_req = lead;
      }
    }
  }
  stats_.queue_depth = (int)queue_.size();
}

// Request `req` takes slot s, whose cache holds the first `prefix` tokens of its prompt.
void Scheduler::start(Slot& s, std::shared_ptr<GenRequest> req, size_t prefix) {
  const int seq = (int)(&s - slots_.data());
  ctx_->crop(seq, (int)prefix);
  ctx_->set_sampling(seq, req->sampling);
  {
    std::lock_guard lk(req->m);
    req->n_cached = (int)prefix;
  }
  s.req = std::move(req);
  s.source = -1;
  s.source_req = nullptr;
  s.n_prefilled = prefix;
  s.last_used = ++n_admitted_;
  s.decoding = false;
  s.stream.emplace(*model_.tokenizer(), /*skip_special=*/!s.req->keep_special);
  s.stops.emplace(s.req->stop);
  s.n_gen = 0;
  s.pending.clear();
  s.n_emitted = s.n_piece_bytes = 0;
  stats_.prompt_tokens_total += (int64_t)s.req->prompt.size();
  stats_.prompt_tokens_cached_total += (int64_t)prefix;
  ++stats_.busy_slots;
  s.lazy_armed = !s.req->lazy_trigger.empty() && s.req->grammar.empty();
  s.lazy_tail.clear();
  if (s.lazy_armed) s.lazy_tail.reserve(s.req->lazy_trigger.size() + kMaxLazyPiece);
  try {  // the grammar was checked when the request came; this builds its matcher
    if (!s.req->grammar.empty()) {
      ctx_->set_grammar(seq, s.req->grammar);
    } else if (ctx_->has_grammar(seq)) {
      ctx_->clear_grammar(seq);
    }
  } catch (const std::exception& e) {
    finish(s, "stop", e.what());
  }
}

// Forks whose lead has prefilled the prompt but its last token copy it into their slots; a fork whose lead
// is gone (finished with an error, cancelled) prefills the prompt itself.
void Scheduler::share_prompts() {
  for (Slot& s : slots_) {
    if (!s.req || s.source < 0) continue;
    const Slot& from = slots_[(size_t)s.source];
    const size_t n = s.req->prompt.size() - 1;
    if (from.req.get() != s.source_req) {
      s.source = -1;
      continue;
    }
    if (from.n_prefilled < n) continue;
    const int seq = (int)(&s - slots_.data());
    try {
      ctx_->copy_seq(s.source, seq, (int)n);
    } catch (const std::exception&) {  // the fork prefills the prompt itself
      s.source = -1;
      continue;
    }
    s.source = -1;
    s.n_prefilled = n;
    stats_.prompt_tokens_shared_total += (int64_t)n;
  }
}

// Hands final text to the consumer, with the log-probabilities of the tokens it holds (all: every pending
// one).
void Scheduler::deliver(Slot& s, const std::string& out, bool all) {
  if (out.empty() && s.pending.empty()) return;
  GenRequest& r = *s.req;
  std::lock_guard lk(r.m);
  r.text += out;
  s.n_emitted += out.size();
  release_logprobs(s, all);
  r.notify();
}

void Scheduler::finish(Slot& s, const char* reason, const std::string& error) {
  if (!s.req) return;
  if (error.empty() && std::string_view(reason) != "cancelled" && s.stream) {
    // The stream's incomplete tail; a stop string may still complete in it.
    std::string out = s.stops->push(s.stream->flush());
    if (s.stops->stopped())
      reason = "stop";
    else
      out += s.stops->flush();
    deliver(s, out, /*all=*/!s.stops->stopped());
  }
  // The slot is free (and counted so) before the request is seen done: a client that reads /metrics
  // right after its answer sees its slot released.
  std::shared_ptr<GenRequest> req = std::move(s.req);
  const int n_gen = s.n_gen;
  // The cache keeps the conversation for the next request that starts with it (prefix reuse); after a
  // failed step it is not trusted.
  if (!error.empty()) ctx_->clear((int)(&s - slots_.data()));
  s.req.reset();
  s.source = -1;
  s.stream.reset();
  s.stops.reset();
  s.pending.clear();
  --stats_.busy_slots;
  std::lock_guard lk(req->m);
  req->done = true;
  req->finish_reason = reason;
  req->error = error;
  req->n_completion = n_gen;
  req->notify();
}

// Hands over the entries whose token's text starts inside the text handed over so far (all: every one).
void Scheduler::release_logprobs(Slot& s, bool all) {
  size_t n = 0;
  while (n < s.pending.size() && (all || s.pending[n].offset < s.n_emitted)) ++n;
  if (n == 0) return;
  auto& out = s.req->logprobs_out;
  out.insert(out.end(), std::make_move_iterator(s.pending.begin()),
             std::make_move_iterator(s.pending.begin() + (ptrdiff_t)n));
  s.pending.erase(s.pending.begin(), s.pending.begin() + (ptrdiff_t)n);
}

// The lazy grammar takes over when the text ends with its trigger (the next sampled token is the first it
// constrains); a trigger followed by more text in the same piece disarms the watch (the grammar cannot
// take text already written), as does a grammar that cannot be set.
void Scheduler::watch_lazy_trigger(Slot& s, int seq, std::string_view piece) {
  const std::string& trigger = s.req->lazy_trigger;
  if (piece.size() > kMaxLazyPiece) piece = piece.substr(piece.size() - kMaxLazyPiece);
  if (s.lazy_tail.size() + piece.size() > s.lazy_tail.capacity())
    s.lazy_tail.erase(0, s.lazy_tail.size() + piece.size() - s.lazy_tail.capacity());
  s.lazy_tail.append(piece);
  if (s.lazy_tail.ends_with(trigger)) {
    s.lazy_armed = false;
    try {
      ctx_->set_grammar(seq, s.req->lazy_grammar);
    } catch (const std::exception&) {  // checked at request time; the output stays free
    }
  } else if (s.lazy_tail.find(trigger) != std::string::npos) {
    s.lazy_armed = false;
  }
}

void Scheduler::on_token(Slot& s, int32_t tok, int row) {
  GenRequest& r = *s.req;
  if (++s.n_gen == 1)
    stats_.observe_ttft(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.submitted).count());
  ++stats_.generated_tokens_total;
  const int seq = (int)(&s - slots_.data());
  if (!r.ignore_eos && model_.is_eog(tok)) {
    finish(s, "stop");
    return;
  }
  if (r.logprobs) {
    TokenLogprobs e;
    e.token = tok;
    e.logprob = ctx_->logprob(row);
    const auto top = ctx_->top_logprobs(row);
    e.top.assign(top.begin(), top.begin() + std::min<ptrdiff_t>((ptrdiff_t)top.size(), r.n_top));
    e.offset = s.n_piece_bytes;
    const Tokenizer& tk = *model_.tokenizer();
    if (r.keep_special || !tk.is_special(tok)) s.n_piece_bytes += tk.token_to_piece(tok).size();
    s.pending.push_back(std::move(e));
  }
  const std::string_view piece = s.stream->push(tok);
  if (s.lazy_armed) watch_lazy_trigger(s, seq, piece);
  // Text that could begin a stop string is held back until it is known not to.
  deliver(s, s.stops->push(piece), false);
  if (s.stops->stopped()) {
    s.stream.reset();  // what the stream still holds comes after the stop string
    finish(s, "stop");
    return;
  }
  if (s.n_gen >= r.max_tokens || ctx_->seq_len(seq) >= n_ctx_) {
    finish(s, "length");
    return;
  }
  s.last = tok;
  s.decoding = true;
}

void Scheduler::run() {
  Batch batch(n_batch_);
  std::vector<std::pair<int, int>> outputs;  // (slot, row) of the rows that sample
  for (;;) {
    {
      std::unique_lock lk(qm_);
      const auto active = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.req != nullptr; });
      };
      qcv_.wait(lk, [&] { return stopping_ || !queue_.empty() || active(); });
      if (stopping_) {
        for (auto& q : queue_) abandon(*q);
        queue_.clear();
        stats_.queue_depth = 0;
        lk.unlock();
        for (Slot& s : slots_) finish(s, "cancelled");
        return;
      }
      admit();
    }
    // Clients that went away give their slots back before the step.
    for (Slot& s : slots_)
      if (s.req && s.req->cancelled) finish(s, "cancelled");
    share_prompts();

    batch.clear();
    outputs.clear();
    for (Slot& s : slots_) {
      if (!s.req || !s.decoding) continue;
      const int seq = (int)(&s - slots_.data());
      outputs.emplace_back(seq, batch.add(s.last, ctx_->seq_len(seq), seq, Output::sample));
    }
    for (Slot& s : slots_) {
      if (!s.req || s.decoding || s.source >= 0) continue;
      const int room = batch.capacity() - batch.size();
      if (room <= 0) break;
      const int seq = (int)(&s - slots_.data());
      const auto& prompt = s.req->prompt;
      const size_t n = std::min(prompt.size() - s.n_prefilled, (size_t)room);
      const bool last = s.n_prefilled + n == prompt.size();
      batch.add_sequence(std::span(prompt).subspan(s.n_prefilled, n), (int32_t)s.n_prefilled, seq,
                         last ? Output::sample : Output::none);
      s.n_prefilled += n;
      stats_.prompt_tokens_prefilled_total += (int64_t)n;
      if (last) outputs.emplace_back(seq, batch.size() - 1);
    }
    if (batch.empty()) continue;
    try {
      ctx_->step(batch);
    } catch (const std::exception& e) {
      for (Slot& s : slots_)
        if (s.req) finish(s, "stop", e.what());
      // A split model whose ranks are out of step (a rank stopped answering or died, or the step stopped
      // on rank 0 mid-forward) can run no later step; one that failed in step (a refused batch, logits that
      // are not finite) goes on, as one process does.
      if (!ctx_->ranks_in_step()) {
        {
          std::lock_guard lk(qm_);
          stopping_ = true;
        }
        if (on_fatal_) on_fatal_(e.what());
      }
      continue;
    }
    ++stats_.steps_total;
    share_prompts();  // before on_token may finish a lead and free its slot
    for (auto [seq, row] : outputs) {
      Slot& s = slots_[(size_t)seq];
      if (s.req) on_token(s, ctx_->sampled(row), row);
    }
  }
}

}  // namespace ultra::server
