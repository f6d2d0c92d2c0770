// ultra::Context and ultra::Batch: sequence bookkeeping, batch validation, and the step that hands a
// validated batch to the backend (engine/backend.h).
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "core/buffer.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/model_impl.h"
#include "engine/testing.h"
#include "kv/sequences.h"

namespace ultra {

// ---- Batch ----

Batch::Batch(int capacity) {
  if (capacity <= 0) fail("batch: capacity must be >= 1 (got {})", capacity);
  token_.resize(capacity);
  pos_.resize(capacity);
  seq_.resize(capacity);
  out_.resize(capacity);
}

int Batch::add(int32_t token, int32_t pos, int32_t seq, Output out) {
  if (n_ >= capacity()) fail("batch: full ({} rows)", capacity());
  token_[n_] = token;
  pos_[n_] = pos;
  seq_[n_] = seq;
  out_[n_] = out;
  return n_++;
}

void Batch::add_sequence(std::span<const int32_t> tokens, int32_t pos0, int32_t seq, Output last) {
  if ((int64_t)n_ + (int64_t)tokens.size() > capacity())
    fail("batch: {} more rows do not fit ({} of {} used)", tokens.size(), n_, capacity());
  for (size_t i = 0; i < tokens.size(); ++i)
    add(tokens[i], pos0 + (int32_t)i, seq, i + 1 == tokens.size() ? last : Output::none);
}

// ---- Context ----

namespace {

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
size_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::string bytes_str(size_t b) {
  return b >= ((size_t)1 << 30) ? fmt::format("{:.2f} GiB", b / 1073741824.0)
                                : fmt::format("{:.2f} MiB", b / 1048576.0);
}

ContextParams resolve(const ModelData& m, ContextParams p, std::vector<std::string>& warnings) {
  const HParams& hp = m.hp;
  const bool ctx_default = p.n_ctx <= 0;
  if (ctx_default) p.n_ctx = std::min(hp.train_ctx, 4096);
  // Mistral's whole-model window (swa_layers empty) is not implemented; the per-layer one is (attention()).
  if (hp.sliding_window > 0 && hp.swa_layers.empty() && p.n_ctx > hp.sliding_window) {
    // Sliding-window attention is not implemented: a longer context would be silently wrong past the window.
    if (!ctx_default)
      fail(
          "context: {} uses sliding-window attention over {} tokens, which is not implemented yet: a context "
          "of {} tokens would give wrong output past position {}; use a context of at most {} tokens",
          m.path, hp.sliding_window, p.n_ctx, hp.sliding_window, hp.sliding_window);
    p.n_ctx = hp.sliding_window;
    warnings.push_back(fmt::format("context limited to the model's sliding window of {} tokens", p.n_ctx));
  }
  if (p.n_ctx > hp.train_ctx)
    warnings.push_back(
        fmt::format("n_ctx {} is larger than the {} tokens the model was trained with; output past "
                    "them may degrade",
                    p.n_ctx, hp.train_ctx));
  if (p.n_slots <= 0) fail("context: n_slots must be >= 1 (got {})", p.n_slots);
  if (p.n_batch <= 0) fail("context: n_batch must be >= 1 (got {})", p.n_batch);
  const int cpus = available_cpus();
  if (p.n_threads <= 0) p.n_threads = cpus;
  if (p.n_threads > cpus && p.backend == BackendKind::cpu) {
    warnings.push_back(fmt::format("{} threads asked for, but this process may use {} CPUs: using {}",
                                   p.n_threads, cpus, cpus));
    p.n_threads = cpus;
  }
  if (p.n_outputs <= 0) p.n_outputs = p.n_slots;
  p.n_outputs = std::min(p.n_outputs, p.n_batch);  // a step outputs at most one row per row
  if (p.n_ctx > (1 << 24)) fail("context: n_ctx {} is too large", p.n_ctx);
  if (p.n_slots > 4096) fail("context: {} slots is too many (at most 4096)", p.n_slots);
  if (p.n_batch > (1 << 16)) fail("context: n_batch {} is too large", p.n_batch);
  if (p.n_threads > 1024) fail("context: {} threads is too many", p.n_threads);
#if !defined(ULTRA_HAVE_CUDA)
  if (p.backend == BackendKind::cuda)
    fail("context: this build has no CUDA backend (it was configured without a CUDA compiler)");
#endif
  if (p.backend == BackendKind::cpu && p.kv_type == KvType::bf16)
    fail("context: a bf16 KV cache is supported on the CUDA backend only (use f32 or f16)");
  return p;
}

// The CPU backend's KV cache and scratch are anonymous memory: refuse before allocating what does not fit.
// (Weights are the mapped file, reclaimable page cache, counted in MemAvailable already.)
void check_memory(const ModelData& m, const ContextParams& p, size_t engine_bytes) {
  const Footprint f = plan_cpu_backend(m, p);
  const size_t need = f.kv + f.scratch + engine_bytes;
  const size_t avail = p.mem_limit ? p.mem_limit : mem_available();
  if (avail && need > avail)
    fail(
        "context: the KV cache ({}: {} tokens x {} slots) and scratch ({}) need {}, but {}; lower the "
        "context "
        "(-c), the batch (-b) or the slots",
        bytes_str(f.kv), p.n_ctx, p.n_slots, bytes_str(f.scratch + engine_bytes), bytes_str(need),
        p.mem_limit ? fmt::format("the limit (--mem-limit) is {}", bytes_str(avail))
                    : fmt::format("{} of memory is available", bytes_str(avail)));
}

}  // namespace

struct Context::Impl {
  Model model;
  const ModelData& m;
  std::vector<std::string> warnings;  // before p: resolve() fills it
  ContextParams p;
  int n_sample;
  std::unique_ptr<Backend> be;

  // Sequences: lengths, tokens, sampler settings (kv/sequences.h).
  Sequences seqs;
  // What Batch::kSampled means for a sequence: nothing (the last step that included it did not sample its
  // last row, or it was cropped), last_sampled[s] (known on the host), or output feed_out[s] of the queued
  // step in record feed_rec[s].
  enum Feed : uint8_t { kNone, kKnown, kQueued };
  std::vector<Feed> feed;             // [n_slots]
  std::vector<int32_t> last_sampled;  // [n_slots]
  std::vector<int> feed_rec, feed_out;
  // Linked contexts (Context::follow).
  Impl* source = nullptr;      // the context this one follows
  Impl* follower = nullptr;    // the context that follows this one
  bool linked_device = false;  // the backend reads the source's device state (Backend::link)
  int queued_reads = 0;        // queued steps that read the source's device state
  // Output::propose rows' kept distributions: ring entry e of sequence s holds the one for position
  // proposed[s * kProposalRing + e] (-1: none; point: the proposer was greedy, its q a point mass).
  std::vector<int32_t> proposed;
  std::vector<uint8_t> proposed_point;

  // One step, host side. Three records: up to two queued steps and the last one waited for, whose results
  // the accessors read.
  struct Record {
    Buffer<int32_t> tok, pos, seq;      // [n_batch] rows (kSampled resolved, or -2 - k: fed on the device)
    Buffer<int32_t> out_row;            // [n_outputs] rows with an output
    Buffer<int32_t> row_out;            // [n_batch] output index of a row, or -1
    Buffer<int32_t> row_job;            // [n_batch] sample job of a row, or -1
    Buffer<int32_t> link_seq;           // [n_batch] the followed sequence of a Batch::follow row, or -1
    bool reads_source = false;          // some row's token is read from the source's device state
    std::vector<SampleJob> jobs;        // [n_outputs]
    std::vector<SampleResult> results;  // [n_outputs]
    Buffer<TokenLogprob> top;           // [n_outputs, kMaxProbs]
    int n = 0, n_out = 0, n_jobs = 0;
  };
  static constexpr int kRecords = 3;
  Record rec[kRecords];
  int next_rec = 0;          // the record the next submit fills
  int n_queued = 0;          // submitted, not waited for: records next_rec - n_queued .. next_rec - 1 (mod 3)
  int shown = -1;            // the record of the last step waited for (-1: none yet)
  Buffer<int32_t> next_pos;  // [n_slots] validation: the position the next row of a sequence must have
  Buffer<int32_t> last_row;  // [n_slots] scratch of submit(): the last row of each sequence in the step
  StepStats stats;

  Impl(const Model& model_, const ContextParams& params)
      : model(model_), m(*detail::impl(model_).data), p(resolve(m, params, warnings)) {
    const Tokenizer* t = model.tokenizer();
    n_sample = t ? std::min(t->n_vocab(), m.hp.n_vocab) : m.hp.n_vocab;
    if (p.backend == BackendKind::cpu) check_memory(m, p, engine_bytes(p));
#if defined(ULTRA_HAVE_CUDA)
    if (p.backend == BackendKind::cuda) be = make_cuda_backend(m, p, n_sample);
#endif
    if (!be) be = make_cpu_backend(m, p, n_sample);
    seqs = Sequences(p.n_slots, p.n_ctx);
    feed.assign(p.n_slots, kNone);
    last_sampled.assign(p.n_slots, -1);
    feed_rec.assign(p.n_slots, -1);
    feed_out.assign(p.n_slots, -1);
    proposed.assign((size_t)p.n_slots * kProposalRing, -1);
    proposed_point.assign((size_t)p.n_slots * kProposalRing, 0);
    for (Record& r : rec) {
      r.tok = Buffer<int32_t>(p.n_batch);
      r.pos = Buffer<int32_t>(p.n_batch);
      r.seq = Buffer<int32_t>(p.n_batch);
      r.out_row = Buffer<int32_t>(p.n_outputs);
      r.row_out = Buffer<int32_t>(p.n_batch);
      r.row_job = Buffer<int32_t>(p.n_batch);
      r.link_seq = Buffer<int32_t>(p.n_batch);
      r.jobs.resize(p.n_outputs);
      r.results.resize(p.n_outputs);
      r.top = Buffer<TokenLogprob>((size_t)p.n_outputs * SamplingParams::kMaxProbs);
    }
    next_pos = Buffer<int32_t>(p.n_slots);
    last_row = Buffer<int32_t>(p.n_slots);
  }

  ~Impl() {
    unlink();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Ends this context's link to the context it follows.
  void unlink_source() {
    if (!source) return;
    source->follower = nullptr;
    source = nullptr;
    linked_device = false;
    be->link({});
  }
  // Ends both links of this context (as follower and as source).
  void unlink() {
    unlink_source();
    if (follower) follower->unlink_source();
  }

  // The engine's own per-context memory: each sequence's tokens, the step records and the per-sequence
  // arrays.
  static size_t engine_bytes(const ContextParams& p) {
    const size_t rec_bytes = 7 * (size_t)p.n_batch * sizeof(int32_t) + (size_t)p.n_outputs * sizeof(int32_t) +
                             (size_t)p.n_outputs * (sizeof(SampleJob) + sizeof(SampleResult)) +
                             (size_t)p.n_outputs * SamplingParams::kMaxProbs * sizeof(TokenLogprob);
    return Sequences::token_bytes(p.n_slots, p.n_ctx) + kRecords * rec_bytes +
           (size_t)p.n_slots * (2 * sizeof(int32_t) + 3 * sizeof(int) + sizeof(SamplingParams) + 1);
  }

  void check_idle(const char* what) const {
    if (n_queued > 0)
      fail("{}: {} submitted step{} still queued (wait() for {} first)", what, n_queued,
           n_queued == 1 ? " is" : "s are", n_queued == 1 ? "it" : "them");
  }

  // Checks every row before anything is written; throws naming the row and the field.
  void validate(const Batch& b) {
    const int n = b.size();
    if (n == 0) fail("step: the batch is empty");
    if (n > p.n_batch)
      fail("step: the batch has {} rows, more than the context's n_batch of {}", n, p.n_batch);
    for (int s = 0; s < p.n_slots; ++s) next_pos[s] = seqs.len(s);
    int n_out = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t s = b.seq(i), t = b.token(i), ps = b.pos(i);
      const Output o = b.output(i);
      if (s < 0 || s >= p.n_slots) fail("step: row {}: sequence {} is out of range [0, {})", i, s, p.n_slots);
      if (t == Batch::kSampled) {
        if (feed[s] == kNone)
          fail("step: row {}: token kSampled, but the last step sampled no token for sequence {}", i, s);
      } else if (t <= -2) {
        const int src = -2 - t;
        if (!source)
          fail("step: row {}: token Batch::follow({}), but the context follows no other (Context::follow)", i,
               src);
        if (src >= source->p.n_slots)
          fail("step: row {}: Batch::follow({}): the followed context has {} sequences", i, src,
               source->p.n_slots);
        if (ps > source->seqs.len(src))
          fail(
              "step: row {}: Batch::follow({}) at position {}: the followed sequence holds {} tokens (a row "
              "may follow it up to one position past its end)",
              i, src, ps, source->seqs.len(src));
        if (ps == source->seqs.len(src) && source->feed[src] == kNone)
          fail(
              "step: row {}: Batch::follow({}) at position {}: the followed sequence's last step sampled no "
              "token for it",
              i, src, ps);
      } else if (t >= m.hp.n_vocab) {
        fail("step: row {}: token id {} is out of range [0, {})", i, t, m.hp.n_vocab);
      }
      if (ps >= p.n_ctx)
        fail("step: row {}: position {} does not fit: the context holds {} tokens per sequence (raise n_ctx)",
             i, ps, p.n_ctx);
      if (ps != next_pos[s])
        fail(
            "step: row {}: position {} of sequence {} does not continue it: expected {} (the sequence holds "
            "{} tokens)",
            i, ps, s, next_pos[s], seqs.len(s));
      ++next_pos[s];
      if ((uint8_t)o > (uint8_t)Output::verify) fail("step: row {}: invalid output kind {}", i, (int)o);
      if (o == Output::propose || o == Output::verify) check_speculative(b, i);
      if (o != Output::none && ++n_out > p.n_outputs)
        fail("step: the batch asks for more than the context's {} output rows (raise n_outputs)",
             p.n_outputs);
    }
  }

  // Output::propose / verify rows (see "Speculative outputs" in context.h).
  void check_speculative(const Batch& b, int i) const {
    const char* what = b.output(i) == Output::propose ? "Output::propose" : "Output::verify";
    if (!be->speculative_outputs()) fail("step: row {}: {} needs the GPU backend", i, what);
    const SamplingParams& sp = seqs.sampling(b.seq(i));
    if (sp.temperature > 0.0f &&
        !(sp.top_k >= 1 && sp.top_k <= SamplingParams::kMaxSpeculativeTopK && sp.top_k < n_sample))
      fail("step: row {}: {} needs a greedy sampler or one with top_k in [1, {}] (below {}); it has top_k {}",
           i, what, SamplingParams::kMaxSpeculativeTopK, n_sample, sp.top_k);
    if (b.output(i) == Output::propose) return;
    if (i + 1 >= b.size() || b.seq(i + 1) != b.seq(i))
      fail(
          "step: row {}: Output::verify needs the next row of the batch to continue its sequence (the "
          "proposal)",
          i);
    const int32_t t = b.token(i + 1);
    if (t == Batch::kSampled)
      fail("step: row {}: Output::verify: the next row's token is kSampled, not a proposal", i);
    if (t >= 0) return;  // a given token: q is the point mass on it
    const int src = -2 - t, ps = b.pos(i) + 1;
    if (!linked_device)
      fail("step: row {}: Output::verify of a followed token needs both contexts on the same GPU", i);
    if (source->proposed[(size_t)src * kProposalRing + ps % kProposalRing] != ps)
      fail(
          "step: row {}: Output::verify: the followed token at position {} of sequence {} was not drawn by "
          "an "
          "Output::propose row",
          i, ps, src);
  }

  void submit(const Batch& b) {
    const auto t0 = std::chrono::steady_clock::now();
    if (n_queued >= 2) fail("submit: two steps are already queued (wait() for one first)");
    if (follower && follower->queued_reads > 0)
      fail(
          "submit: a queued step of the following context reads this context's tokens (wait() for it first)");
    validate(b);
    const int ri = next_rec;
    Record& r = rec[ri];
    const int n = b.size();
    int n_out = 0, n_jobs = 0;
    bool reads = false;
    for (int i = 0; i < n; ++i) {
      const int32_t s = b.seq(i), ps = b.pos(i);
      int32_t t = b.token(i);
      int32_t known = t;  // what the host's copy of the sequence gets now
      r.link_seq[i] = -1;
      if (t == Batch::kSampled) {
        // A queued source is the step submitted just before this one (at most one other is queued).
        t = known = feed[s] == kKnown ? last_sampled[s] : -2 - feed_out[s];
        if (known < 0) known = -1;
      } else if (t <= -2) {
        t = known = follow_token(i, -2 - t, ps);
        if (known < 0) {
          known = -1;
          reads = true;
        }
        r.link_seq[i] = -2 - b.token(i);
      }
      r.tok[i] = t;
      r.pos[i] = ps;
      r.seq[i] = s;
      seqs.tokens(s)[ps] = known;  // the penalty windows of this step's sample rows read these (CPU)
      last_row[s] = i;
      r.row_out[i] = r.row_job[i] = -1;
      // The token at ps is given now (any row): a proposal kept for it stays only when it was fed as drawn.
      if (b.token(i) != Batch::kSampled && proposed[(size_t)s * kProposalRing + ps % kProposalRing] == ps)
        proposed[(size_t)s * kProposalRing + ps % kProposalRing] = -1;
      if (b.output(i) == Output::none) continue;
      r.row_out[i] = n_out;
      r.out_row[n_out] = i;
      const Output o = b.output(i);
      if (o == Output::sample || o == Output::propose || o == Output::verify) {
        const SamplingParams& sp = seqs.sampling(s);
        const auto win = penalty_window(sp, {seqs.tokens(s), (size_t)ps + 1});
        SampleJob& job = r.jobs[n_jobs];
        job = {n_out, &sp, win.data(), (int)win.size(), (int64_t)ps + 1};
        const bool greedy = !(sp.temperature > 0.0f);
        if (o == Output::propose && !greedy) job.kind = o;
        if (o == Output::propose) {
          const size_t e = (size_t)s * kProposalRing + (ps + 1) % kProposalRing;
          proposed[e] = ps + 1;
          proposed_point[e] = greedy;
        }
        if (o == Output::verify && !greedy) {
          job.kind = o;
          const int32_t t1 = b.token(i + 1);
          if (t1 <= -2) {
            const int src = -2 - t1;
            if (!source->proposed_point[(size_t)src * kProposalRing + (ps + 1) % kProposalRing]) {
              job.q_src = src;
              reads = true;  // the source's ring: it must not submit before this step is waited for
            }
          }
        }
        r.row_job[i] = n_jobs++;
      }
      ++n_out;
    }
    r.n = n;
    r.n_out = n_out;
    r.n_jobs = n_jobs;
    r.reads_source = reads;
    StepRows rows;
    rows.n = n;
    rows.token = r.tok.data();
    rows.pos = r.pos.data();
    rows.seq = r.seq.data();
    rows.n_out = n_out;
    rows.out_row = r.out_row.data();
    const bool async = be->asynchronous();
    if (async)
      be->submit(rows, r.jobs.data(), n_jobs, r.results.data(), r.top.data(), stats);
    else
      be->step(rows, r.jobs.data(), n_jobs, r.results.data(), r.top.data(), stats);
    // The step is the backend's now: the sequences' new lengths, and what kSampled will mean for them.
    ++stats.n_steps;
    stats.n_rows += n;
    stats.n_sampled += n_jobs;
    next_rec = (next_rec + 1) % kRecords;
    ++n_queued;
    if (reads) ++queued_reads;
    for (int i = 0; i < n; ++i) {
      const int s = r.seq[i];
      seqs.set_len(s, r.pos[i] + 1);
      if (last_row[s] != i) continue;
      if (r.row_job[i] >= 0) {
        feed[s] = kQueued;
        feed_rec[s] = ri;
        feed_out[s] = r.row_out[i];
      } else {
        feed[s] = kNone;
      }
    }
    if (!async) finish(ri);  // its results are there already
    stats.submit_us +=
        1e3 * std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++stats.n_submits;
  }

  // The host's side of a step that has run: tokens the device fed (sampled by the step before, finished
  // already: known) into the sequences' copies, then this step's samples.
  void finish(int ri) {
    Record& r = rec[ri];
    for (int i = 0; i < r.n; ++i) {
      if (r.tok[i] >= 0) continue;
      r.tok[i] = seqs.tokens(r.seq[i])[r.pos[i]] =
          r.link_seq[i] >= 0 ? followed(r.link_seq[i], r.pos[i]) : last_sampled[r.seq[i]];
    }
    for (int i = 0; i < r.n; ++i) {
      const int s = r.seq[i];
      last_sampled[s] = r.row_job[i] >= 0 ? r.results[r.row_job[i]].token : -1;
      if (feed[s] == kQueued && feed_rec[s] == ri) feed[s] = kKnown;
    }
  }

  // A Batch::follow token, now: the source's token at pos of its sequence src, or the one its last step
  // sampled for pos (one past the end); -1 while only the device knows it.
  int32_t followed(int src, int pos) const {
    const Impl& S = *source;
    if (pos < S.seqs.len(src)) return S.seqs.tokens(src)[pos];
    return pos == S.seqs.len(src) && S.feed[src] == kKnown ? S.last_sampled[src] : -1;
  }
  // What submit() stages for row i's Batch::follow(src) at pos: the token when the host knows it, else the
  // backend's reference to the source's device state.
  int32_t follow_token(int i, int src, int pos) const {
    const int32_t v = followed(src, pos);
    if (v >= 0) return v;
    if (!linked_device)
      fail(
          "step: row {}: Batch::follow({}): the followed token is still on the device in a queued step of "
          "the "
          "followed context, and the backends cannot share it (wait() for the followed context first)",
          i, src);
    const Impl& S = *source;
    if (pos < S.seqs.len(src)) return Backend::kLinkedLog - src;
    if (S.feed_rec[src] != (S.next_rec + kRecords - 1) % kRecords)
      fail(
          "step: row {}: Batch::follow({}): the followed token comes from a queued step that is not the "
          "followed context's last",
          i, src);
    return Backend::kLinkedOut - S.feed_out[src];
  }

  void wait() {
    if (n_queued == 0) fail("wait: no step is queued");
    const int ri = (next_rec - n_queued + kRecords) % kRecords;
    Record& r = rec[ri];
    if (r.reads_source)  // the host must be able to learn the followed tokens: check before the step ends
      for (int i = 0; i < r.n; ++i)
        if (r.tok[i] < 0 && r.link_seq[i] >= 0 && followed(r.link_seq[i], r.pos[i]) < 0)
          fail(
              "wait: row {} follows a token of a step of the followed context that has not been waited for "
              "(wait() for the followed context first)",
              i);
    --n_queued;
    if (r.reads_source) --queued_reads;
    shown = ri;
    if (be->asynchronous()) {
      be->complete(stats);
      finish(ri);
    }
    for (int j = 0; j < r.n_jobs; ++j) {
      if (!r.results[j].nonfinite) continue;
      const int i = r.out_row[r.jobs[j].out];
      fail("step: the logits of sequence {} at position {} hold NaN or infinity (broken weights or overflow)",
           r.seq[i], r.pos[i]);
    }
  }

  const Record* shown_rec() const {
    return shown >= 0 ? &rec[shown] : nullptr;
  }
  int job_of(int row, const char* what) const {
    const Record* r = shown_rec();
    if (!r || row < 0 || row >= r->n || r->row_job[row] < 0)
      fail("{}: row {} of the last step did not ask for a sampled token", what, row);
    return r->row_job[row];
  }
};

Context::Context(const Model& model, const ContextParams& params)
    : impl_(std::make_unique<Impl>(model, params)) {}
Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

const Model& Context::model() const {
  return impl_->model;
}
const ContextParams& Context::params() const {
  return impl_->p;
}
Footprint Context::footprint() const {
  Footprint f = impl_->be->footprint();
  f.scratch += Impl::engine_bytes(impl_->p);
  return f;
}
std::span<const std::string> Context::warnings() const {
  return impl_->warnings;
}
const char* Context::backend_name() const {
  return impl_->be->name();
}
std::string Context::backend_description() const {
  return impl_->be->description();
}
int Context::n_sample_vocab() const {
  return impl_->n_sample;
}

int Context::seq_len(int seq) const {
  impl_->seqs.check(seq, "seq_len");
  return impl_->seqs.len(seq);
}
std::span<const int32_t> Context::seq_tokens(int seq) const {
  impl_->seqs.check(seq, "seq_tokens");
  return impl_->seqs.held(seq);
}
void Context::crop(int seq, int n) {
  impl_->seqs.check_crop(seq, n, "crop");
  impl_->check_idle("crop");
  if (n < impl_->seqs.len(seq)) {
    impl_->feed[seq] = Impl::kNone;
    for (int e = 0; e < kProposalRing; ++e)  // proposals for the positions forgotten
      if (int32_t& at = impl_->proposed[(size_t)seq * kProposalRing + e]; at >= n) at = -1;
  }
  impl_->seqs.crop(seq, n);
}

void testing::poison_kv_past_length(Context& ctx, int seq) {
  Context::Impl& c = detail::impl(ctx);
  c.seqs.check(seq, "poison_kv_past_length");
  c.check_idle("poison_kv_past_length");
  c.be->poison_kv(seq, c.seqs.len(seq));
}

namespace {

// testing::defer_steps: the wrapped backend runs each step when it is completed.
class DeferredBackend final : public Backend {
 public:
  DeferredBackend(std::unique_ptr<Backend> inner, int n_batch, int n_outputs)
      : inner_(std::move(inner)), tok_(n_batch), prev_(n_outputs, -1) {}
  const char* name() const override { return inner_->name(); }
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
      if (t <= Backend::kLinkedOut)
        tok_[i] = link_->prev_[Backend::kLinkedOut - t];
      else if (t <= Backend::kLinkedLog)
        tok_[i] = link_src_.host_tokens[(size_t)(Backend::kLinkedLog - t) * link_src_.n_ctx + q.rows.pos[i]];
      else
        tok_[i] = t <= -2 ? prev_[-2 - t] : t;
      if (tok_[i] < 0) fail("deferred backend: row {}: a fed token is not known yet", i);
    }
    q.rows.token = tok_.data();
    inner_->step(q.rows, q.jobs, q.n_jobs, q.results, q.top, stats);
    std::fill(prev_.begin(), prev_.end(), -1);
    for (int j = 0; j < q.n_jobs; ++j) prev_[q.jobs[j].out] = q.results[j].token;
  }
  const float* logits(int k) override { return inner_->logits(k); }
  void poison_kv(int seq, int from) override { inner_->poison_kv(seq, from); }
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
  c.check_idle("defer_steps");
  c.be = std::make_unique<DeferredBackend>(std::move(c.be), c.p.n_batch, c.p.n_outputs);
}

void Context::set_sampling(int seq, const SamplingParams& p) {
  impl_->seqs.set_sampling(seq, p);
}
const SamplingParams& Context::sampling(int seq) const {
  impl_->seqs.check(seq, "sampling");
  return impl_->seqs.sampling(seq);
}
SeqSnapshot Context::snapshot(int seq) const {
  return impl_->seqs.snapshot(seq);
}
void Context::restore(int seq, const SeqSnapshot& s) {
  impl_->seqs.check_restore(seq, s);
  crop(seq, s.n_tokens);
  impl_->seqs.restore(seq, s);
}

void Context::step(const Batch& batch) {
  impl_->check_idle("step");
  impl_->submit(batch);
  impl_->wait();
}
void Context::submit(const Batch& batch) {
  impl_->submit(batch);
}
void Context::wait() {
  impl_->wait();
}
int Context::n_queued() const {
  return impl_->n_queued;
}
void Context::follow(Context* source) {
  Impl& me = *impl_;
  me.check_idle("follow");
  if (source) {
    Impl& s = *source->impl_;
    if (&s == &me) fail("follow: a context cannot follow itself");
    s.check_idle("follow");
    if (s.follower && s.follower != &me) fail("follow: the context to follow is followed by another already");
  }
  me.unlink_source();  // its own follower stays
  if (!source) return;
  Impl& s = *source->impl_;
  me.linked_device = me.be->link({s.be.get(), s.seqs.token_log(), s.p.n_ctx, s.p.n_slots});
  me.source = &s;
  s.follower = &me;
}
bool Context::asynchronous() const {
  return impl_->be->asynchronous();
}
bool Context::speculative_outputs() const {
  return impl_->be->speculative_outputs();
}

int32_t Context::sampled(int row) const {
  return impl_->shown_rec()->results[impl_->job_of(row, "sampled")].token;
}
float Context::logprob(int row) const {
  return impl_->shown_rec()->results[impl_->job_of(row, "logprob")].logprob;
}
std::span<const TokenLogprob> Context::top_logprobs(int row) const {
  const int j = impl_->job_of(row, "top_logprobs");
  const Impl::Record& r = *impl_->shown_rec();
  return {r.top.data() + (size_t)j * SamplingParams::kMaxProbs, (size_t)r.results[j].n_top};
}
std::span<const float> Context::logits(int row) {
  const Impl& im = *impl_;
  const Impl::Record* r = im.shown_rec();
  if (!r || row < 0 || row >= r->n || r->row_out[row] < 0)
    fail("logits: row {} of the last step did not ask for an output", row);
  im.check_idle("logits");
  return {impl_->be->logits(r->row_out[row]), (size_t)im.m.hp.n_vocab};
}
const StepStats& Context::stats() const {
  return impl_->stats;
}
std::span<const BackendStat> Context::backend_stats() const {
  return impl_->be->stats();
}
double Context::backend_stat(std::string_view name) const {
  for (const BackendStat& s : impl_->be->stats())
    if (name == s.name) return s.value;
  return 0;
}

}  // namespace ultra
