// ultra::Context and ultra::Batch: sequence bookkeeping, batch validation, and the step that hands a
// validated batch to the backend (engine/backend.h).
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

#include "core/buffer.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/model_impl.h"
#include "engine/testing.h"

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

  // Sequences.
  std::vector<int> len;                  // [n_slots] tokens in the cache
  Buffer<int32_t> tokens;                // [n_slots, n_ctx] the tokens, by position
  std::vector<SamplingParams> sampling;  // [n_slots]
  std::vector<int32_t> last_sampled;     // [n_slots] token sampled by the last step that sampled, or -1

  // One step, host side.
  Buffer<int32_t> tok, pos, seq;  // [n_batch] rows (kSampled resolved)
  Buffer<int32_t> out_row;        // [n_outputs] rows with an output
  Buffer<int32_t> row_out;        // [n_batch] output index of a row, or -1
  Buffer<int32_t> row_job;        // [n_batch] sample job of a row, or -1
  Buffer<int32_t> next_pos;       // [n_slots] validation: the position the next row of a sequence must have
  std::vector<SampleJob> jobs;    // [n_outputs]
  std::vector<SampleResult> results;  // [n_outputs]
  Buffer<TokenLogprob> top;           // [n_outputs, kMaxProbs]
  int last_rows = 0;                  // rows of the last step (results are valid for these)
  StepStats stats;

  Impl(const Model& model_, const ContextParams& params)
      : model(model_), m(*model_.impl().data), p(resolve(m, params, warnings)) {
    const Tokenizer* t = model.tokenizer();
    n_sample = t ? std::min(t->n_vocab(), m.hp.n_vocab) : m.hp.n_vocab;
    // The engine's own per-context memory: each sequence's tokens and the step's host arrays.
    const size_t engine_bytes = ((size_t)p.n_slots * p.n_ctx + 6 * (size_t)p.n_batch) * sizeof(int32_t);
    if (p.backend == BackendKind::cpu) check_memory(m, p, engine_bytes);
#if defined(ULTRA_HAVE_CUDA)
    if (p.backend == BackendKind::cuda) be = make_cuda_backend(m, p, n_sample);
#endif
    if (!be) be = make_cpu_backend(m, p, n_sample);
    len.assign(p.n_slots, 0);
    tokens = Buffer<int32_t>((size_t)p.n_slots * p.n_ctx);
    sampling.assign(p.n_slots, SamplingParams{});
    last_sampled.assign(p.n_slots, -1);
    tok = Buffer<int32_t>(p.n_batch);
    pos = Buffer<int32_t>(p.n_batch);
    seq = Buffer<int32_t>(p.n_batch);
    out_row = Buffer<int32_t>(p.n_outputs);
    row_out = Buffer<int32_t>(p.n_batch);
    row_job = Buffer<int32_t>(p.n_batch);
    next_pos = Buffer<int32_t>(p.n_slots);
    jobs.resize(p.n_outputs);
    results.resize(p.n_outputs);
    top = Buffer<TokenLogprob>((size_t)p.n_outputs * SamplingParams::kMaxProbs);
  }

  int32_t* seq_tokens(int s) {
    return tokens.data() + (size_t)s * p.n_ctx;
  }

  void check_seq(int s, const char* what) const {
    if (s < 0 || s >= p.n_slots) fail("{}: sequence {} is out of range [0, {})", what, s, p.n_slots);
  }

  // Checks every row before anything is written; throws naming the row and the field.
  void validate(const Batch& b) {
    const int n = b.size();
    if (n == 0) fail("step: the batch is empty");
    if (n > p.n_batch)
      fail("step: the batch has {} rows, more than the context's n_batch of {}", n, p.n_batch);
    for (int s = 0; s < p.n_slots; ++s) next_pos[s] = len[s];
    int n_out = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t s = b.seq(i), t = b.token(i), ps = b.pos(i);
      const Output o = b.output(i);
      if (s < 0 || s >= p.n_slots) fail("step: row {}: sequence {} is out of range [0, {})", i, s, p.n_slots);
      if (t == Batch::kSampled) {
        if (last_sampled[s] < 0)
          fail("step: row {}: token kSampled, but the last step sampled no token for sequence {}", i, s);
      } else if (t < 0 || t >= m.hp.n_vocab) {
        fail("step: row {}: token id {} is out of range [0, {})", i, t, m.hp.n_vocab);
      }
      if (ps >= p.n_ctx)
        fail("step: row {}: position {} does not fit: the context holds {} tokens per sequence (raise n_ctx)",
             i, ps, p.n_ctx);
      if (ps != next_pos[s])
        fail(
            "step: row {}: position {} of sequence {} does not continue it: expected {} (the sequence holds "
            "{} "
            "tokens)",
            i, ps, s, next_pos[s], len[s]);
      ++next_pos[s];
      if ((uint8_t)o > (uint8_t)Output::sample) fail("step: row {}: invalid output kind {}", i, (int)o);
      if (o != Output::none && ++n_out > p.n_outputs)
        fail("step: the batch asks for more than the context's {} output rows (raise n_outputs)",
             p.n_outputs);
    }
  }

  void step(const Batch& b) {
    validate(b);
    const int n = b.size();
    int n_out = 0, n_jobs = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t s = b.seq(i), ps = b.pos(i);
      const int32_t t = b.token(i) == Batch::kSampled ? last_sampled[s] : b.token(i);
      tok[i] = t;
      pos[i] = ps;
      seq[i] = s;
      seq_tokens(s)[ps] = t;  // the penalty windows of this step's sample rows read these
      row_out[i] = row_job[i] = -1;
      if (b.output(i) == Output::none) continue;
      row_out[i] = n_out;
      out_row[n_out] = i;
      if (b.output(i) == Output::sample) {
        const SamplingParams& sp = sampling[s];
        const auto win = penalty_window(sp, {seq_tokens(s), (size_t)ps + 1});
        jobs[n_jobs] = {n_out, &sp, win.data(), (int)win.size(), (int64_t)ps + 1};
        row_job[i] = n_jobs++;
      }
      ++n_out;
    }
    StepRows rows;
    rows.n = n;
    rows.token = tok.data();
    rows.pos = pos.data();
    rows.seq = seq.data();
    rows.n_out = n_out;
    rows.out_row = out_row.data();
    be->step(rows, jobs.data(), n_jobs, results.data(), top.data(), stats);

    last_rows = n;
    ++stats.n_steps;
    stats.n_rows += n;
    stats.n_sampled += n_jobs;
    for (int i = 0; i < n; ++i) {
      const int s = seq[i];
      len[s] = pos[i] + 1;
      last_sampled[s] = row_job[i] >= 0 ? results[row_job[i]].token : -1;
    }
    for (int j = 0; j < n_jobs; ++j) {
      if (!results[j].nonfinite) continue;
      const int i = out_row[jobs[j].out];
      fail("step: the logits of sequence {} at position {} hold NaN or infinity (broken weights or overflow)",
           seq[i], pos[i]);
    }
  }

  int job_of(int row, const char* what) const {
    if (row < 0 || row >= last_rows || row_job[row] < 0)
      fail("{}: row {} of the last step did not ask for a sampled token", what, row);
    return row_job[row];
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
  const Impl& im = *impl_;
  f.scratch += im.tokens.bytes() + im.tok.bytes() * 5 + im.out_row.bytes() + im.next_pos.bytes() +
               im.top.bytes() + im.jobs.size() * (sizeof(SampleJob) + sizeof(SampleResult));
  return f;
}
std::span<const std::string> Context::warnings() const {
  return impl_->warnings;
}
const char* Context::backend_name() const {
  return impl_->be->name();
}
int Context::n_sample_vocab() const {
  return impl_->n_sample;
}

int Context::seq_len(int seq) const {
  impl_->check_seq(seq, "seq_len");
  return impl_->len[seq];
}
std::span<const int32_t> Context::seq_tokens(int seq) const {
  impl_->check_seq(seq, "seq_tokens");
  return {impl_->tokens.data() + (size_t)seq * impl_->p.n_ctx, (size_t)impl_->len[seq]};
}
void Context::crop(int seq, int n) {
  impl_->check_seq(seq, "crop");
  if (n < 0 || n > impl_->len[seq])
    fail("crop: sequence {} holds {} tokens, cannot keep {}", seq, impl_->len[seq], n);
  if (n < impl_->len[seq]) impl_->last_sampled[seq] = -1;
  impl_->len[seq] = n;
}

void testing::poison_kv_past_length(Context& ctx, int seq) {
  Context::Impl& c = ctx.impl();
  c.check_seq(seq, "poison_kv_past_length");
  c.be->poison_kv(seq, c.len[seq]);
}

void Context::set_sampling(int seq, const SamplingParams& p) {
  impl_->check_seq(seq, "set_sampling");
  p.validate();
  impl_->sampling[seq] = p;
}
const SamplingParams& Context::sampling(int seq) const {
  impl_->check_seq(seq, "sampling");
  return impl_->sampling[seq];
}
SeqSnapshot Context::snapshot(int seq) const {
  impl_->check_seq(seq, "snapshot");
  return {impl_->len[seq], impl_->sampling[seq]};
}
void Context::restore(int seq, const SeqSnapshot& s) {
  impl_->check_seq(seq, "restore");
  if (s.n_tokens < 0 || s.n_tokens > impl_->len[seq])
    fail("restore: sequence {} holds {} tokens, the snapshot {}", seq, impl_->len[seq], s.n_tokens);
  s.sampling.validate();
  crop(seq, s.n_tokens);
  impl_->sampling[seq] = s.sampling;
}

void Context::step(const Batch& batch) {
  impl_->step(batch);
}

int32_t Context::sampled(int row) const {
  return impl_->results[impl_->job_of(row, "sampled")].token;
}
float Context::logprob(int row) const {
  return impl_->results[impl_->job_of(row, "logprob")].logprob;
}
std::span<const TokenLogprob> Context::top_logprobs(int row) const {
  const int j = impl_->job_of(row, "top_logprobs");
  return {impl_->top.data() + (size_t)j * SamplingParams::kMaxProbs, (size_t)impl_->results[j].n_top};
}
std::span<const float> Context::logits(int row) {
  const Impl& im = *impl_;
  if (row < 0 || row >= im.last_rows || im.row_out[row] < 0)
    fail("logits: row {} of the last step did not ask for an output", row);
  return {impl_->be->logits(im.row_out[row]), (size_t)im.m.hp.n_vocab};
}
const StepStats& Context::stats() const {
  return impl_->stats;
}

}  // namespace ultra
