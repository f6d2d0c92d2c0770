// ultra::Context: creation (parameters resolved, memory checked), the step that hands a validated batch to
// the backend (engine/backend.h) and takes its results back, and the public calls. The rest of its insides
// are listed in engine/context_impl.h.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "engine/access.h"
#include "engine/context_impl.h"

namespace ultra {

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
  if (p.n_ctx <= 0) p.n_ctx = std::min(hp.train_ctx, 4096);
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
  if (m.comm && p.backend != BackendKind::cpu)
    fail("context: a model split over ranks (--tp) runs on the CPU backend only (use --backend cpu)");
  if (m.comm && m.tp_rank != 0)
    fail(
        "context: rank {} of a split model runs rank 0's steps (run_tp_follower); only rank 0 creates "
        "contexts",
        m.tp_rank);
  if (m.comm && m.tp_contexts > 0)
    fail("context: a model split over ranks (--tp) has one context at a time (its other ranks follow it)");
  if (p.backend == BackendKind::cpu && p.kv_type == KvType::bf16)
    fail("context: a bf16 KV cache is supported on the CUDA backend only (use f32 or f16)");
  return p;
}

}  // namespace

// The CPU backend's KV cache and scratch are anonymous memory: refuse before allocating what does not fit.
// (Weights are the mapped file, reclaimable page cache, counted in MemAvailable already.)
void check_cpu_memory(const ModelData& m, const ContextParams& p, size_t engine_bytes) {
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

Context::Impl::Impl(const Model& model_, const ContextParams& params)
    : model(model_), m(*detail::impl(model_).data), p(resolve(m, params, warnings)) {
  const Tokenizer* t = model.tokenizer();
  n_sample = t ? std::min(t->n_vocab(), m.hp.n_vocab) : m.hp.n_vocab;
  if (p.backend == BackendKind::cpu) check_cpu_memory(m, p, engine_bytes(p));
#if defined(ULTRA_HAVE_CUDA)
  if (p.backend == BackendKind::cuda) be = make_cuda_backend(m, p, n_sample);
#endif
  if (!be) be = make_cpu_backend(m, p, n_sample);
  seqs = Sequences(p.n_slots, p.n_ctx);
  sampled = LastSampled(p.n_slots);
  proposals = ProposalRing(p.n_slots);
  queue = StepQueue(p.n_batch, p.n_outputs);
  next_pos = Buffer<int32_t>(p.n_slots);
  last_row = Buffer<int32_t>(p.n_slots);
  constraints.resize(p.n_slots);
  rule_rows.resize(p.n_outputs);
}

size_t Context::Impl::engine_bytes(const ContextParams& p) {
  return Sequences::token_bytes(p.n_slots, p.n_ctx) + StepQueue::bytes(p.n_batch, p.n_outputs) +
         LastSampled::bytes(p.n_slots) + ProposalRing::bytes(p.n_slots) +
         (size_t)p.n_slots * (2 * sizeof(int32_t) + sizeof(int) + sizeof(SamplingParams));
}

void Context::Impl::complete_for_masks(const Batch& b) {
  if (!mask_vocab || queue.n_queued() == 0) return;  // no grammar yet, or every token known
  // The queued step (the one submitted just before: at most one is queued).
  const int ri = queue.oldest_index();
  StepRecord& r = queue.at(ri);
  if (r.completed) return;
  const int n = b.size();
  // last_row as scratch: the last row with an output of each sequence of b (-1: none, or not in b).
  for (int i = 0; i < r.n; ++i) last_row[r.seq[i]] = -1;
  for (int i = 0; i < n; ++i) last_row[b.seq(i)] = -1;
  for (int i = 0; i < n; ++i)
    if (b.output(i) != Output::none) last_row[b.seq(i)] = i;
  bool wait_queued = false;
  for (int i = 0; i < n; ++i) {
    const int s = b.seq(i);
    if (!constraints[s] || last_row[s] < i) continue;  // no mask reads this row's token in this step
    const RowToken t = b.token(i);
    if (t.from == TokenFrom::sampled && !sampled.known(s)) wait_queued = true;
    if (t.from == TokenFrom::followed && followed(t.value, b.pos(i)) < 0)
      fail(
          "submit: row {}: sequence {} has a grammar, and its token Batch::follow({}) is still on the device "
          "in a queued step of the followed context (wait() for the followed context first)",
          i, s, t.value);
  }
  // Tokens of the queued step that only the device knows yet (fed on the device), read by a mask of b.
  for (int i = 0; i < r.n && !wait_queued; ++i)
    wait_queued = r.feed[i] != TokenFeed::id && constraints[r.seq[i]] && last_row[r.seq[i]] >= 0;
  if (!wait_queued) return;
  // The host waits for the queued step now; wait() will only show it.
  check_followed_known(r);
  be->complete(stats);
  finish(ri);
  r.completed = true;
}

void Context::Impl::submit(const Batch& b) {
  const auto t0 = std::chrono::steady_clock::now();
  if (queue.n_queued() >= 2) fail("submit: two steps are already queued (wait() for one first)");
  check_no_reader();
  validate(b);
  if (be->asynchronous()) complete_for_masks(b);
  const int ri = queue.next_index();
  StepRecord& r = queue.next();
  r.completed = false;
  const int n = b.size();
  int n_out = 0, n_jobs = 0, n_rules = 0;
  bool reads = false;
  for (int i = 0; i < n; ++i) {
    const int32_t s = b.seq(i), ps = b.pos(i);
    const RowToken bt = b.token(i);
    int32_t t = bt.value;
    TokenFeed f = TokenFeed::id;
    r.link_seq[i] = -1;
    if (bt.from == TokenFrom::sampled) {
      // A queued source is the step submitted just before this one (at most one other is queued).
      if (sampled.known(s)) {
        t = sampled.token(s);
      } else {
        t = sampled.output(s);
        f = TokenFeed::prev_output;
      }
    } else if (bt.from == TokenFrom::followed) {
      f = follow_token(i, bt.value, ps, t);
      if (f != TokenFeed::id) reads = true;
      r.link_seq[i] = bt.value;
    }
    r.tok[i] = t;
    r.feed[i] = f;
    r.pos[i] = ps;
    r.seq[i] = s;
    // The host's copy of the sequence (-1 while only the device knows the token): the penalty windows of
    // this step's sample rows read it (CPU).
    seqs.tokens(s)[ps] = f == TokenFeed::id ? t : -1;
    last_row[s] = i;
    r.row_out[i] = r.row_job[i] = -1;
    // The token at ps is given now (any row): a proposal kept for it stays only when it was fed as drawn.
    if (bt.from != TokenFrom::sampled) proposals.given(s, ps);
    const Output o = b.output(i);
    if (o == Output::none) continue;
    r.row_out[i] = n_out;
    r.out_row[n_out] = i;
    if (o == Output::logits && (constraints[s] || seqs.sampling(s).n_logit_bias > 0)) {
      // The sequence's rules apply to the logits it shows too (speculative decoding samples from them on
      // the host): after the step, on the host.
      const uint32_t* mask = nullptr;
      if (SeqConstraint* c = constraints[s].get()) {
        uint32_t* m = masks.data() + (size_t)n_out * mask_vocab->n_words();
        c->mask(seqs.tokens(s), ps, m);
        mask = m;
      }
      rule_rows[n_rules++] = {n_out, &seqs.sampling(s), mask};
    }
    if (o == Output::sample || o == Output::propose || o == Output::verify) {
      const SamplingParams& sp = seqs.sampling(s);
      const auto win = penalty_window(sp, {seqs.tokens(s), (size_t)ps + 1});
      SampleJob& job = r.jobs[n_jobs];
      job = {n_out, &sp, win.data(), (int)win.size(), (int64_t)ps + 1};
      if (SeqConstraint* c = constraints[s].get()) {
        uint32_t* mask = masks.data() + (size_t)n_out * mask_vocab->n_words();
        c->mask(seqs.tokens(s), ps, mask);
        job.allow = mask;
      }
      const bool greedy = !(sp.temperature > 0.0f);
      if (o == Output::propose && !greedy) job.kind = o;
      if (o == Output::propose) proposals.keep(s, ps + 1, greedy);
      if (o == Output::verify && !greedy) {
        job.kind = o;
        const RowToken t1 = b.token(i + 1);
        if (t1.from == TokenFrom::followed && !source->proposals.point(t1.value, ps + 1)) {
          job.q_src = t1.value;
          reads = true;  // the source's ring: it must not submit before this step is waited for
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
  const StepRows rows = r.rows();
  const bool async = be->asynchronous();
  const bool rules_in_step = be->rules_in_step();
  if (rules_in_step) be->logits_rules(rule_rows.data(), n_rules);
  if (async)
    be->submit(rows, r.jobs.data(), n_jobs, r.results.data(), r.top.data(), stats);
  else
    be->step(rows, r.jobs.data(), n_jobs, r.results.data(), r.top.data(), stats);
  for (int k = 0; k < n_rules && !rules_in_step; ++k) {
    const LogitsRule& rr = rule_rows[k];
    be->apply_rules(rr.out, *rr.params, rr.allow);
  }
  // The step is the backend's now: the sequences' new lengths, and what kSampled will mean for them.
  ++stats.n_steps;
  stats.n_rows += n;
  stats.n_sampled += n_jobs;
  queue.push();
  if (reads) ++queued_reads;
  for (int i = 0; i < n; ++i) {
    const int s = r.seq[i];
    seqs.set_len(s, r.pos[i] + 1);
    if (last_row[s] != i) continue;
    if (r.row_job[i] >= 0)
      sampled.queue(s, ri, r.row_out[i]);
    else
      sampled.forget(s);
  }
  if (!async) finish(ri);  // its results are there already
  stats.submit_us +=
      1e3 * std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats.n_submits;
}

void Context::Impl::finish(int ri) {
  StepRecord& r = queue.at(ri);
  // Tokens the device fed (sampled by the step before, finished already, or read from the source).
  for (int i = 0; i < r.n; ++i) {
    if (r.feed[i] == TokenFeed::id) continue;
    r.tok[i] = seqs.tokens(r.seq[i])[r.pos[i]] =
        r.link_seq[i] >= 0 ? followed(r.link_seq[i], r.pos[i]) : sampled.token(r.seq[i]);
    r.feed[i] = TokenFeed::id;
  }
  sampled.finish(r, ri);
}

void Context::Impl::wait() {
  if (queue.n_queued() == 0) fail("wait: no step is queued");
  const int ri = queue.oldest_index();
  StepRecord& r = queue.at(ri);
  check_followed_known(r);  // the host must be able to learn the followed tokens: before the step ends
  queue.pop();
  if (r.reads_source) --queued_reads;
  if (be->asynchronous() && !r.completed) {  // (completed: a grammar's mask waited for it already)
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
  impl_->queue.check_idle("crop");
  if (n < impl_->seqs.len(seq)) {
    impl_->sampled.forget(seq);
    impl_->proposals.crop(seq, n);
    if (impl_->constraints[seq]) impl_->constraints[seq]->crop(n);
  }
  impl_->seqs.crop(seq, n);
}

void Context::copy_seq(int from, int to, int n) {
  Impl& im = *impl_;
  im.seqs.check_crop(from, n, "copy_seq");
  im.seqs.check(to, "copy_seq");
  if (from == to) fail("copy_seq: sequence {} cannot be copied onto itself", from);
  im.queue.check_idle("copy_seq");
  im.sampled.forget(to);
  im.proposals.crop(to, 0);
  if (im.constraints[to]) im.constraints[to]->crop(0);
  im.be->copy_kv(from, to, n);
  std::copy_n(im.seqs.tokens(from), n, im.seqs.tokens(to));
  im.seqs.set_len(to, n);
}

void Context::set_sampling(int seq, const SamplingParams& p) {
  p.validate(impl_->n_sample);
  impl_->seqs.set_sampling(seq, p);
}

void Context::set_grammar(int seq, std::string_view gbnf) {
  Impl& im = *impl_;
  im.seqs.check(seq, "set_grammar");
  im.queue.check_idle("set_grammar");
  const Tokenizer* t = im.model.tokenizer();
  if (!t) fail("set_grammar: the model has no tokenizer (a grammar constrains text)");
  if (!im.mask_vocab) {
    im.mask_vocab = grammar::MaskVocab::from_tokenizer(detail::impl(*t).t);
    im.masks.assign((size_t)im.p.n_outputs * im.mask_vocab->n_words(), 0);
  }
  im.constraints[seq] =
      std::make_unique<SeqConstraint>(grammar_tables(im.grammar_tables, gbnf, im.mask_vocab));
}
void Context::clear_grammar(int seq) {
  impl_->seqs.check(seq, "clear_grammar");
  impl_->queue.check_idle("clear_grammar");
  impl_->constraints[seq].reset();
}
bool Context::has_grammar(int seq) const {
  impl_->seqs.check(seq, "has_grammar");
  return impl_->constraints[seq] != nullptr;
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
  impl_->queue.check_idle("step");
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
  return impl_->queue.n_queued();
}
bool Context::ranks_in_step() const {
  return impl_->be->ranks_in_step();
}
bool Context::asynchronous() const {
  return impl_->be->asynchronous();
}
bool Context::speculative_outputs() const {
  return impl_->be->speculative_outputs();
}

int32_t Context::sampled(int row) const {
  const StepQueue& q = impl_->queue;
  return q.shown()->results[q.job_of(row, "sampled")].token;
}
float Context::logprob(int row) const {
  const StepQueue& q = impl_->queue;
  return q.shown()->results[q.job_of(row, "logprob")].logprob;
}
std::span<const TokenLogprob> Context::top_logprobs(int row) const {
  const StepQueue& q = impl_->queue;
  const int j = q.job_of(row, "top_logprobs");
  const StepRecord& r = *q.shown();
  return {r.top.data() + (size_t)j * SamplingParams::kMaxProbs, (size_t)r.results[j].n_top};
}
std::span<const float> Context::logits(int row) {
  const Impl& im = *impl_;
  const StepRecord* r = im.queue.shown();
  if (!r || row < 0 || row >= r->n || r->row_out[row] < 0)
    fail("logits: row {} of the last step did not ask for an output", row);
  im.queue.check_idle("logits");
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
