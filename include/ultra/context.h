// A context: the KV cache of n_slots sequences, the scratch of one step, and one step function that runs
// any mix of rows — a prefill chunk of one sequence beside single-token decodes of others, or K+1 rows of
// one sequence for speculative verification — in one pass over the weights.
//
//   ultra::Context ctx(model, {.n_ctx = 2048, .n_slots = 4});
//   ultra::Batch batch(ctx.params().n_batch);
//   batch.add_sequence(prompt, /*pos0=*/0, /*seq=*/0, ultra::Output::sample);  // sample after the last
//   ctx.step(batch);
//   int32_t next = ctx.sampled(batch.size() - 1);
//
// Sequences. Each sequence lives in its own KV slot; the context, not the backend, knows its tokens and
// length. crop(seq, n) forgets everything from position n on in O(1) (the cache is written in place and
// never moved).
//
// Rows. A row is (token, position, sequence, output). Its token is an id, or a RowToken saying where the step
// takes it from: Batch::kSampled (the sequence's last sampled token) or Batch::follow(s) (a followed
// context's token; see "Linked contexts"). The rows of one sequence in a batch must continue it: positions
// seq_len, seq_len + 1, ... in batch order. Output::logits makes the row's logits available through
// logits(row); Output::sample also draws a token from them with the sequence's sampler (penalties over the
// sequence's tokens up to and including the row's own token), inside the step, on the backend that ran it.
// step() checks every field of the batch before it touches any memory and throws ultra::Error naming the
// row and field; then nothing has changed.
//
// Sampling state is derived, not accumulated: the penalty window is the sequence's own tokens and the
// random numbers are keyed by (seed, position) (see sampling.h). snapshot()/restore() are therefore
// O(1), and crop + sample again repeats a seeded continuation exactly.
//
// Queued steps. step() runs a step and waits for it. submit() only queues it: on a GPU backend the step
// runs while the host prepares the next one, and a row whose token is Batch::kSampled, when the token comes
// from the step still in flight, is fed on the device (no host round trip between the two steps). wait()
// finishes the oldest queued step and makes its results the ones sampled(), logprob() and top_logprobs()
// return. At most two steps are queued at once. While a step is queued, seq_len() already counts its rows
// (so the next submit() continues from there) but seq_tokens() shows -1 at the positions of tokens that
// only the device knows yet; crop(), restore(), logits() and step() wait for nothing and refuse to run
// (they throw) until wait() has emptied the queue. On the CPU a submitted step runs inside submit().
//
// Linked contexts. follow(source) lets this context's rows take tokens from another context's sequences
// (Batch::follow). A followed token still on the device (the source's step is queued) is read there when
// both contexts run on the GPU: the step waits on the device for the source's last submitted step (other
// pairs need the source's step waited for before the submit; on the CPU it always is). Rules: the source
// must not submit again while a step of this context that reads it is queued, and the source's steps must
// be waited for before this context's step that reads them (wait() throws otherwise).
//
// Speculative outputs (GPU backend). A propose row samples like a sample row and keeps the filtered
// distribution q its token was drawn from. A verify row at position n must be followed, in the same step,
// by a row of its sequence at n + 1 whose token x is a proposal: Batch::follow(s) of a token a propose row
// of the followed context drew for that position (q is that row's distribution), or a token given as is (q
// is the point mass on it, as for prompt lookup). The verify row's sampled() token is x when the rejection
// test keeps it (probability min(1, p(x) / q(x)), p the row's own filtered distribution), else a draw from
// normalize(max(0, p - q)); so the first verify row whose token differs from the next row's marks the first
// rejection, and every token is distributed as the target's sampler would draw it (Leviathan et al. 2023).
// Both need a sampler with 1 <= top_k <= 1024 (below the sampled vocabulary) or a greedy one (then both
// are plain sample rows: the argmax is its own point mass).
//
// Allocation: everything is allocated when the context is created; step() and the calls below allocate
// nothing (a test counts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ultra/model.h"
#include "ultra/sampling.h"

namespace ultra {

enum class BackendKind { cpu, cuda };
enum class KvType { f32, f16, bf16 };  // bf16: CUDA backend only

struct ContextParams {
  BackendKind backend = BackendKind::cpu;
  int n_ctx = 0;      // tokens per sequence (0: the model's training context, at most 4096)
  int n_slots = 1;    // sequences held at once
  int n_batch = 512;  // most rows in one step
  int n_outputs = 0;  // most rows with an output in one step (0: n_slots)
  KvType kv_type = KvType::f32;
  int n_threads = 0;  // CPU threads (0: all the CPUs this process may use; more are capped with a warning)
  // CPU backend: most bytes the KV cache and scratch may take (0: the memory the system has available,
  // MemAvailable). The footprint is computed first and a context that does not fit is refused with one line
  // naming the sizes, before anything is allocated.
  size_t mem_limit = 0;
  // GPU backend: record an event before and after every replayed step, so that the backend statistic
  // gpu_idle_us (backend_stats()) gets the GPU's idle time between consecutive replays (host work between
  // steps); about 1 us of host time per step. `ultra bench` turns it on.
  bool gpu_timing = false;
  // GPU backend: progress of the weight upload when it takes more than a second (bytes done, bytes in all):
  // called at most every 100 ms, and once more when done (done == total). The CLI prints a progress line.
  std::function<void(size_t done, size_t total)> upload_progress = nullptr;
};

// Memory a context holds, in bytes.
struct Footprint {
  size_t weights = 0;  // weights one step reads (the mapped file on the CPU)
  size_t kv = 0;       // KV cache
  size_t scratch = 0;  // activations, logits, sampler and step buffers
};

enum class Output : uint8_t {
  none,    // no output: the row only extends its sequence
  logits,  // logits(row) available after the step
  sample,  // a token drawn with the sequence's sampler (sampled(row)); logits(row) too
  // Speculative decoding on the device (Context::speculative_outputs(); see "Speculative outputs" below):
  propose,  // as sample, and the distribution the token was drawn from is kept for a follower's verify row
  verify,   // the next row's token (a proposal) kept or replaced by the rejection test against this row's
            // distribution
};

// Where a row's token comes from.
enum class TokenFrom : uint8_t {
  id,        // the token id given (RowToken::value)
  sampled,   // the token last sampled for the row's sequence (Batch::kSampled)
  followed,  // a token of sequence RowToken::value of the context this one follows (Batch::follow)
};

// A row's token: a token id, or where the step takes it from. A plain id converts to it, so add(id, ...)
// reads as before; any id (negative ones too) is an id, checked against the vocabulary by step().
struct RowToken {
  TokenFrom from = TokenFrom::id;
  int32_t value = 0;  // id: the token id; followed: the followed sequence; sampled: unused (0)
  constexpr RowToken(int32_t id) : value(id) {}  // NOLINT(google-explicit-constructor): a token id
  constexpr RowToken(TokenFrom from_, int32_t value_) : from(from_), value(value_) {}
  friend constexpr bool operator==(const RowToken&, const RowToken&) = default;
};

// The rows of one step. Allocates once (its capacity); add() and clear() allocate nothing.
class Batch {
 public:
  // As a token: "the token last sampled for this sequence" (by the most recent step that included it, if
  // that step sampled it). It lets a caller queue the next decode step without reading the last result
  // first (a GPU backend feeds it on the device).
  static constexpr RowToken kSampled{TokenFrom::sampled, 0};
  // As a token: "the token at this row's position in sequence src_seq of the context this one follows"
  // (Context::follow), where the position just past that sequence's end stands for the token its last
  // step sampled for it. A draft context's proposals go into the target's verification step this way;
  // on a GPU the target reads them from the draft's device memory, so the host waits for neither.
  static constexpr RowToken follow(int32_t src_seq) { return {TokenFrom::followed, src_seq}; }

  explicit Batch(int capacity);

  // Appends a row and returns its index. Throws ultra::Error when the batch is full.
  int add(RowToken token, int32_t pos, int32_t seq, Output out = Output::none);
  // Appends tokens at positions pos0, pos0 + 1, ... of seq; `last` is the output of the last row.
  void add_sequence(std::span<const int32_t> tokens, int32_t pos0, int32_t seq, Output last = Output::none);
  void clear() { n_ = 0; }

  int size() const { return n_; }
  int capacity() const { return (int)token_.size(); }
  bool empty() const { return n_ == 0; }
  RowToken token(int row) const { return {from_[row], token_[row]}; }
  int32_t pos(int row) const { return pos_[row]; }
  int32_t seq(int row) const { return seq_[row]; }
  Output output(int row) const { return out_[row]; }

 private:
  std::vector<int32_t> token_, pos_, seq_;
  std::vector<Output> out_;
  std::vector<TokenFrom> from_;
  int n_ = 0;
};

// What snapshot() keeps: a sequence's length and sampler settings.
struct SeqSnapshot {
  int n_tokens = 0;
  SamplingParams sampling;
};

// Time spent inside step(), cumulative since the context was created. What only one backend counts (the
// CUDA backend's graph launches) is asked of the backend: Context::backend_stats().
struct StepStats {
  double forward_ms = 0;  // the forward pass (embedding to logits); on a GPU backend the whole step
  double sample_ms = 0;   // sampling (CPU backend; on a GPU it runs inside the step and is not split out)
  int64_t n_steps = 0;
  int64_t n_rows = 0;
  int64_t n_sampled = 0;
  // Host time inside submit() (validation, staging and the launch; on the CPU the whole step) over n_submits
  // calls: the host's dispatch cost per step when steps are queued ahead.
  double submit_us = 0;
  int64_t n_submits = 0;
};

// One statistic a backend keeps about its own work, cumulative since the context was created. The CPU
// backend keeps none. The CUDA backend's (docs/CUDA.md):
//   graph_launches  steps replayed as a captured graph
//   launch_us       host time spent launching them, in microseconds (the per-token dispatch cost)
//   gpu_idle_us     with ContextParams::gpu_timing: the GPU's idle time between the end of a replayed step
//                   and the start of the next one, in microseconds, summed over gpu_gaps consecutive pairs
//   gpu_gaps
struct BackendStat {
  const char* name;  // static storage
  double value;
};

class Context {
 public:
  // Allocates the KV cache and all scratch. Throws ultra::Error on impossible parameters.
  Context(const Model& model, const ContextParams& params = {});
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;

  const Model& model() const;
  const ContextParams& params() const;  // defaults resolved
  Footprint footprint() const;
  const char* backend_name() const;  // "CPU" or "CUDA"
  // What runs the steps, for a person: e.g. "CPU (avx512 kernels; Q8_0 with int8 activations)".
  std::string backend_description() const;
  // Ids at or above this are never sampled (the tokenizer's size when it is smaller than the embeddings).
  int n_sample_vocab() const;
  // What creating the context adjusted or wants the user to know (threads capped to the CPUs available, a
  // context longer than the model was trained for, ...), one message each.
  std::span<const std::string> warnings() const;

  // --- sequences: seq in [0, n_slots) ---
  int seq_len(int seq) const;
  std::span<const int32_t> seq_tokens(int seq) const;  // the tokens now in the cache, by position
  void crop(int seq, int n);                           // keep positions [0, n); O(1); n <= seq_len
  void clear(int seq) { crop(seq, 0); }
  // Sequence `to` becomes the first n tokens of sequence `from` (n <= seq_len(from); from != to): their KV
  // (every layer) is copied on the backend, so a prompt prefilled once serves several continuations (n > 1
  // completions). `to` keeps its sampler settings; its grammar, if any, starts again as after a crop to 0.
  // Costs a copy of n positions of the cache; allocates nothing. Throws (changing nothing) on a bad slot or
  // length, and while steps are queued.
  void copy_seq(int from, int to, int n);

  // --- sampling: one sampler per sequence ---
  // Validates (logit_bias tokens below n_sample_vocab()); allocates nothing. A logit bias is applied on
  // every backend (the CUDA backend's in the step, before its sampler).
  void set_sampling(int seq, const SamplingParams& p);
  const SamplingParams& sampling(int seq) const;
  // A grammar constraint (llama.cpp's GBNF syntax, root rule "root"): the tokens the sequence's sample
  // rows draw from now on form a prefix of a sentence of the grammar; end-of-generation tokens are allowed
  // exactly when the text so far is a whole sentence, and are the only ones allowed at a dead end (or after
  // a token the grammar refuses was given as input), so a constrained sequence always ends cleanly.
  //  * It covers the tokens from the one after the next row with an output (Output::sample, or
  //    Output::logits, whose logits it masks too) on, given or drawn, and follows the sequence: crop() /
  //    restore() roll it back with the tokens, so speculative rollback and regeneration compose with it.
  //    (Give the prompt's rows before the last no output, as generate() does.)
  //  * The mask is computed on the host before the step (src/grammar/token_mask.h) and applied to the
  //    row's logits before the sampler's chain (then a logit bias). Steps with constrained rows allocate
  //    nothing once the grammar states they meet were seen before.
  //  * On the CUDA backend the mask (n_sample_vocab() / 32 words) is copied into the step's pinned block and
  //    applied inside the step. The host needs the sequence's tokens for it: a step submitted while the one
  //    that samples the sequence's last token is queued (Batch::kSampled) waits for that step first (the
  //    other sequences of the batch wait with it); a Batch::follow token still on the device in the followed
  //    context's queued step throws. Needs the model's tokenizer.
  // Throws ultra::Error with the parser's message (line, column, what was expected) for a bad grammar,
  // and while steps are queued. Setting a grammar replaces the previous one.
  void set_grammar(int seq, std::string_view gbnf);
  void clear_grammar(int seq);
  bool has_grammar(int seq) const;

  SeqSnapshot snapshot(int seq) const;          // O(1)
  void restore(int seq, const SeqSnapshot& s);  // O(1); s.n_tokens <= seq_len(seq)

  // --- one step ---
  void step(const Batch& batch);    // submit(batch) then wait(); throws while other steps are queued
  void submit(const Batch& batch);  // queues a step (see "Queued steps" above); throws when two are queued
  void wait();                      // finishes the oldest queued step; throws when none is
  int n_queued() const;             // steps submitted and not yet waited for
  // Rows with the token Batch::follow(s) take it from `source` (see "Linked contexts"); null unlinks.
  // Throws while either context has queued steps, or when the two cannot be linked (different backends, a
  // context following itself, a source that already has a follower).
  void follow(Context* source);
  // A model split over ranks (LoadParams::tp > 1): whether its ranks are still at the same step, so that the
  // context can go on after a step threw. False once a collective failed (a rank stopped answering within
  // LoadParams::tp_timeout_s, or the transport failed) or a step threw on rank 0 after the other ranks were
  // sent it (mid-forward): no later step can run, and the program should end the job. An error raised
  // before the step reached the other ranks (a refused batch) or after every rank ran its forward (logits
  // that are not finite, sampling) leaves them in step: only that step failed, as with one process. Always
  // true for a model that is not split.
  bool ranks_in_step() const;
  // Whether submit() returns before the step has run (a GPU backend), so that queuing ahead pays.
  bool asynchronous() const;
  // Whether Output::propose and Output::verify rows run here (the GPU backend).
  bool speculative_outputs() const;

  // Results of the last step, by batch row (a row that asked for them).
  int32_t sampled(int row) const;  // Output::sample, propose and verify rows
  // Log-probability of sampled(row) under the distribution it came from. Greedy rows compute it (a pass
  // of exp over the vocabulary) only when the sampler's n_probs > 0, and give NaN otherwise.
  float logprob(int row) const;
  std::span<const TokenLogprob> top_logprobs(int row) const;  // n_probs best, best first
  // Output::logits and Output::sample rows: [n_vocab]. On a GPU backend this copies them to the host. For a
  // sequence with a grammar or a logit bias they are the logits its sampler sees: refused and banned tokens
  // at -infinity, biases added (penalties and temperature not applied).
  std::span<const float> logits(int row);

  const StepStats& stats() const;
  // The backend's own statistics (see BackendStat), their values now (valid until the next call);
  // backend_stat(name) is one of them by name, 0 when the backend keeps none of that name.
  std::span<const BackendStat> backend_stats() const;
  double backend_stat(std::string_view name) const;

  struct Impl;  // opaque: defined in src/engine

 private:
  std::unique_ptr<Impl> impl_;
  friend struct detail::Access;
};

// Tensor parallelism (LoadParams::tp > 1), on every rank but 0: runs the steps of rank 0's contexts on this
// rank's shard (a context of the same parameters per context rank 0 creates, one at a time), and returns
// once rank 0's model is destroyed. Throws ultra::Error when a collective fails or times out (the caller
// ends the job). On rank 0, or for a model not split, throws at once.
void run_tp_follower(const Model& model);

}  // namespace ultra
