#include "backend/cuda/step_io.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backend/cuda/device_memory.h"
#include "core/error.h"

namespace ultra::cuda {

static_assert(sizeof(RuleBias) == sizeof(LogitBias) &&
                  offsetof(LogitBias, token) == offsetof(RuleBias, token) &&
                  offsetof(LogitBias, bias) == offsetof(RuleBias, bias),
              "logit biases are copied into the rules block as they are");
static_assert(kRuleMaxBias == SamplingParams::kMaxLogitBias, "a row's biases fit its rules block entry");

StepIoLayout StepIoLayout::make(int n_rows, int n_out, int n_vocab) {
  StepIoLayout l{};
  const size_t nb = n_rows, no = n_out;
  size_t o = 0;
  auto put = [&](size_t bytes) {
    const size_t at = o;
    o = DeviceAllocator::aligned(o + bytes);
    return at;
  };
  l.tok = put(nb * 4);
  l.feed = put(nb * sizeof(TokenFeed));
  l.pos = put(nb * 4);
  l.seq = put(nb * 4);
  l.out_row = put(no * 4);
  l.srow = put(no * sizeof(SamplerRow));
  l.in_bytes = o;
  o = 0;
  l.token = put(no * 4);
  l.logprob = put(no * 4);
  l.top_token = put(no * kSamplerMaxProbs * 4);
  l.top_logprob = put(no * kSamplerMaxProbs * 4);
  l.error = put(no * 4);
  l.rule_error = put(no * 4);
  l.out_bytes = o;
  l.mask_words = ((size_t)(std::max(n_vocab, 0) + 31) / 32 + 3) / 4 * 4;
  o = 0;
  put(no * l.mask_words * 4);
  l.bias_at = put(no * SamplingParams::kMaxLogitBias * sizeof(RuleBias));
  l.rules_bytes = o;
  return l;
}

StepIo::StepIo(const StepIoLayout& lay, int n_out_cap, int n_vocab, void* d_in, void* d_out)
    : lay_(lay),
      n_vocab_((size_t)n_vocab),
      d_in_(static_cast<uint8_t*>(d_in)),
      d_out_(static_cast<uint8_t*>(d_out)) {
  for (int i = 0; i < kInFlight; ++i) {
    check(cudaMallocHost((void**)&h_in_[i], lay_.in_bytes), "pinned host allocation");
    check(cudaMallocHost((void**)&h_out_[i], lay_.out_bytes), "pinned host allocation");
    check(cudaMallocHost((void**)&h_rules_[i], lay_.rules_bytes), "pinned host allocation");
    std::memset(h_in_[i], 0, lay_.in_bytes);
    check(cudaEventCreateWithFlags(&done_ev_[i], cudaEventDisableTiming), "event creation");
  }
  check(cudaMallocHost((void**)&h_logits_, (size_t)n_out_cap * n_vocab_ * sizeof(float)),
        "pinned host allocation");
  logits_ready_.assign(n_out_cap, 0);
}

StepIo::~StepIo() {
  for (int i = 0; i < kInFlight; ++i) {
    if (h_in_[i]) cudaFreeHost(h_in_[i]);
    if (h_out_[i]) cudaFreeHost(h_out_[i]);
    if (h_rules_[i]) cudaFreeHost(h_rules_[i]);
    if (done_ev_[i]) cudaEventDestroy(done_ev_[i]);
  }
  if (h_logits_) cudaFreeHost(h_logits_);
}

// The rules of output row k into the rules block h (SamplerRow::allow / bias / n_bias / rules).
void StepIo::stage_rules(uint8_t* h, int k, const SamplingParams& sp, const uint32_t* allow, int n_sample,
                         SamplerRow& s) const {
  if (allow) {
    uint32_t* m = reinterpret_cast<uint32_t*>(h) + (size_t)k * lay_.mask_words;
    std::memcpy(m, allow, (size_t)(n_sample + 31) / 32 * sizeof(uint32_t));
    s.allow = m;
  }
  if (sp.n_logit_bias > 0) {
    RuleBias* b = reinterpret_cast<RuleBias*>(h + lay_.bias_at) + (size_t)k * SamplingParams::kMaxLogitBias;
    std::memcpy(b, sp.logit_bias, (size_t)sp.n_logit_bias * sizeof(RuleBias));
    s.bias = b;
    s.n_bias = sp.n_logit_bias;
  }
  s.rules = s.allow || s.n_bias > 0;
}

void StepIo::stage(int parity, const StepRows& rows, int n_eff, int n_out_eff, const SampleJob* jobs,
                   int n_jobs, const LogitsRule* rules, int n_rules, int n_sample,
                   const SamplerSources& src) {
  uint8_t* h_in = h_in_[parity];
  int32_t* tok = reinterpret_cast<int32_t*>(h_in + lay_.tok);
  TokenFeed* feed = reinterpret_cast<TokenFeed*>(h_in + lay_.feed);
  int32_t* pos = reinterpret_cast<int32_t*>(h_in + lay_.pos);
  int32_t* seq = reinterpret_cast<int32_t*>(h_in + lay_.seq);
  int32_t* out_row = reinterpret_cast<int32_t*>(h_in + lay_.out_row);
  SamplerRow* srow = reinterpret_cast<SamplerRow*>(h_in + lay_.srow);
  const int n = rows.n;
  for (int i = 0; i < n_eff; ++i) {
    const bool real = i < n;
    tok[i] = real ? rows.token[i] : 0;
    feed[i] = real && rows.feed ? rows.feed[i] : TokenFeed::id;
    pos[i] = real ? rows.pos[i] : 0;
    seq[i] = real ? rows.seq[i] : -1;
  }
  for (int k = 0; k < n_out_eff; ++k) {
    out_row[k] = k < rows.n_out ? rows.out_row[k] : -1;
    srow[k] = {};
    srow[k].logits_row = -1;
  }
  for (int j = 0; j < n_jobs; ++j) {
    const SampleJob& job = jobs[j];
    const SamplingParams& sp = *job.params;
    const int r = rows.out_row[job.out];
    SamplerRow& s = srow[job.out];
    s.temperature = sp.temperature;
    s.top_k = sp.top_k;
    s.top_p = sp.top_p;
    s.min_p = sp.min_p;
    s.repeat_penalty = sp.repeat_penalty;
    s.presence_penalty = sp.presence_penalty;
    s.frequency_penalty = sp.frequency_penalty;
    s.n_probs = sp.n_probs;
    s.seed = sp.seed;
    s.position = job.position;
    // The window ends at the row's own token, in the device copy of the sequence's tokens.
    s.n_hist = std::min(job.n_window, src.max_hist);
    s.hist = src.token_log + (int64_t)rows.seq[r] * src.n_ctx + (rows.pos[r] + 1 - s.n_hist);
    s.logits_row = job.out;
    s.propose = nullptr;
    s.x = nullptr;
    s.q = nullptr;
    const size_t entry = (size_t)(job.position % kProposalRing);
    if (job.kind == Output::propose) s.propose = src.proposals + (size_t)rows.seq[r] * kProposalRing + entry;
    if (job.kind == Output::verify) {
      s.x = src.token_log + (int64_t)rows.seq[r] * src.n_ctx + job.position;
      if (job.q_src >= 0) {
        if (!src.linked_proposals)
          fail("CUDA backend: row {} verifies a linked backend's proposal, but none is linked", r);
        s.q = src.linked_proposals + (size_t)job.q_src * kProposalRing + entry;
      }
    }
    if (job.allow || sp.n_logit_bias > 0) stage_rules(h_rules_[parity], job.out, sp, job.allow, n_sample, s);
  }
  for (int i = 0; i < n_rules; ++i)
    stage_rules(h_rules_[parity], rules[i].out, *rules[i].params, rules[i].allow, n_sample,
                srow[rules[i].out]);
}

void StepIo::read_results(int parity, const SampleJob* jobs, int n_jobs, SampleResult* results,
                          TokenLogprob* top) const {
  const uint8_t* h_out = h_out_[parity];
  const int32_t* r_tok = reinterpret_cast<const int32_t*>(h_out + lay_.token);
  const float* r_lp = reinterpret_cast<const float*>(h_out + lay_.logprob);
  const int32_t* r_ttok = reinterpret_cast<const int32_t*>(h_out + lay_.top_token);
  const float* r_tlp = reinterpret_cast<const float*>(h_out + lay_.top_logprob);
  const int32_t* r_err = reinterpret_cast<const int32_t*>(h_out + lay_.error);
  const int32_t* r_rule_err = reinterpret_cast<const int32_t*>(h_out + lay_.rule_error);
  const SamplerRow* srow = reinterpret_cast<const SamplerRow*>(h_in_[parity] + lay_.srow);  // as staged
  for (int j = 0; j < n_jobs; ++j) {
    const int k = jobs[j].out;
    SampleResult& r = results[j];
    r.token = r_tok[k];
    r.logprob = r_lp[k];
    // With rules, -infinity logits are theirs: the flag is logit_rules', of the logits before them.
    r.nonfinite = (srow[k].rules ? r_rule_err[k] : r_err[k]) != 0;
    r.n_top = 0;
    const int want = std::min(jobs[j].params->n_probs, kSamplerMaxProbs);
    for (int i = 0; i < want && r_ttok[k * kSamplerMaxProbs + i] >= 0; ++i) {
      top[(size_t)j * SamplingParams::kMaxProbs + i] = {r_ttok[k * kSamplerMaxProbs + i],
                                                        r_tlp[k * kSamplerMaxProbs + i]};
      r.n_top = i + 1;
    }
  }
}

const float* StepIo::logits(int k, const float* d_logits, cudaStream_t stream) {
  const size_t V = n_vocab_;
  float* dst = h_logits_ + (size_t)k * V;
  if (!logits_ready_[k]) {
    check(cudaMemcpyAsync(dst, d_logits + (size_t)k * V, V * sizeof(float), cudaMemcpyDeviceToHost, stream),
          "logits download");
    check(cudaStreamSynchronize(stream), "logits download");
    logits_ready_[k] = 1;
  }
  return dst;
}

}  // namespace ultra::cuda
