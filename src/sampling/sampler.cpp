#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace ultra {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

inline bool is_greedy(const SamplingParams& p) {
  return !(p.temperature > 0.0f);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int n_vocab) : params_(params), n_vocab_(n_vocab) {
  if (n_vocab <= 0) throw std::invalid_argument("Sampler: n_vocab must be positive");
  const int window = params.repeat_last_n < 0 ? kMaxHistory : params.repeat_last_n;
  penalties_on_ = window > 0 && (params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f ||
                                 params.frequency_penalty != 0.0f);
  window_ = penalties_on_ ? window : 0;
  history_.assign(window_, 0);
  counts_.assign(penalties_on_ ? n_vocab : 0, 0);
  distinct_pos_.assign(penalties_on_ ? n_vocab : 0, 0);
  distinct_.assign(std::min(window_, n_vocab), 0);
  cand_.resize(n_vocab);
  probs_.resize(n_vocab);
  logprobs_.resize(std::min(std::max(params.n_probs, 0), n_vocab));
  seed_rng();
}

void Sampler::seed_rng() {
  uint64_t x = params_.seed;
  for (uint64_t& s : rng_state_) s = splitmix64(x);
}

// xoshiro256**
uint64_t Sampler::next_u64() {
  uint64_t* s = rng_state_;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Sampler::next_uniform() {
  return (double)(next_u64() >> 11) * 0x1.0p-53;
}

void Sampler::reset() {
  for (int k = 0; k < n_distinct_; ++k) counts_[distinct_[k]] = 0;
  n_distinct_ = 0;
  history_pos_ = history_len_ = 0;
  n_logprobs_ = 0;
  seed_rng();
}

void Sampler::accept(int32_t token) {
  if (!penalties_on_ || token < 0 || token >= n_vocab_) return;
  if (history_len_ == window_) {  // the oldest token leaves the window
    const int32_t old = history_[history_pos_];
    if (--counts_[old] == 0) {
      const int32_t j = distinct_pos_[old];
      const int32_t last = distinct_[--n_distinct_];
      distinct_[j] = last;
      distinct_pos_[last] = j;
    }
  } else {
    ++history_len_;
  }
  history_[history_pos_] = token;
  if (++history_pos_ == window_) history_pos_ = 0;
  if (counts_[token]++ == 0) {
    distinct_pos_[token] = n_distinct_;
    distinct_[n_distinct_++] = token;
  }
}

// count > 0. Same arithmetic as llama.cpp's penalties sampler.
inline float Sampler::penalise(float logit, uint32_t count) const {
  logit = logit <= 0.0f ? logit * params_.repeat_penalty : logit / params_.repeat_penalty;
  return logit - ((float)count * params_.frequency_penalty + params_.presence_penalty);
}

void Sampler::apply_penalties(const float* logits, float* out) const {
  std::copy(logits, logits + n_vocab_, out);
  for (int k = 0; k < n_distinct_; ++k) {
    const int32_t t = distinct_[k];
    out[t] = penalise(out[t], counts_[t]);
  }
}

void Sampler::fill_candidates(const float* logits) {
  Candidate* c = cand_.data();
  for (int i = 0; i < n_vocab_; ++i) {
    const float v = logits[i];
    c[i] = {std::isnan(v) ? kNegInf : v, i};
  }
  for (int k = 0; k < n_distinct_; ++k) {
    const int32_t t = distinct_[k];
    c[t].logit = penalise(c[t].logit, counts_[t]);
  }
}

namespace {
// Candidate order: logit desc, then id asc (a strict total order once NaNs are gone).
template <class C>
inline bool better(const C& a, const C& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}
}  // namespace

int32_t Sampler::greedy(const float* logits) {
  n_logprobs_ = 0;
  const int n = n_vocab_;
  if (!logprobs_.empty()) {
    // Needs the whole penalised vocabulary: log-softmax at temperature 1 (log-sum-exp in double).
    fill_candidates(logits);
    Candidate* c = cand_.data();
    int32_t best = 0;
    float best_v = c[0].logit;
    for (int i = 1; i < n; ++i) {
      if (c[i].logit > best_v) best_v = c[i].logit, best = i;
    }
    const double m = best_v;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
      const float x = c[i].logit;
      sum += x == best_v ? 1.0 : std::exp((double)x - m);
    }
    const double log_sum = std::log(sum);
    const int k = (int)logprobs_.size();
    auto cmp = [](const Candidate& a, const Candidate& b) { return better(a, b); };
    if (k < n) std::nth_element(c, c + k, c + n, cmp);
    std::sort(c, c + k, cmp);
    for (int j = 0; j < k; ++j) {
      const double d = c[j].logit == best_v ? 0.0 : (double)c[j].logit - m;
      logprobs_[j] = {c[j].id, (float)(d - log_sum)};
    }
    n_logprobs_ = k;
    return best;
  }
  return argmax(logits);
}

// One pass, no copy: strict '>' keeps the lowest id on ties (NaNs are never picked over a number).
int32_t Sampler::argmax(const float* logits) const {
  const int n = n_vocab_;
  int32_t best = 0;
  float best_v = kNegInf;
  if (n_distinct_ == 0) {
    for (int i = 0; i < n; ++i) {
      if (logits[i] > best_v) best_v = logits[i], best = i;
    }
  } else {
    const uint32_t* cnt = counts_.data();
    for (int i = 0; i < n; ++i) {
      const float v = cnt[i] ? penalise(logits[i], cnt[i]) : logits[i];
      if (v > best_v) best_v = v, best = i;
    }
  }
  return best;
}

int Sampler::build_distribution() {
  Candidate* c = cand_.data();
  auto cmp = [](const Candidate& a, const Candidate& b) { return better(a, b); };
  const float temp = params_.temperature;
  const float min_p = params_.min_p;
  int n = n_vocab_;
  const int k = (params_.top_k <= 0 || params_.top_k >= n) ? n : params_.top_k;

  // min-p and top-k are both prefix filters of the same order, so min-p can be applied first as a cheap
  // O(V) pre-filter on logits: exp((l - l_max) / T) >= min_p  <=>  l >= l_max + T log(min_p). The bound is
  // loosened by a margin; the exact test on the probabilities below decides. This keeps top_k = 0 cheap.
  if (min_p > 0.0f && min_p <= 1.0f) {
    float mx = kNegInf;
    for (int i = 0; i < n; ++i) mx = std::max(mx, c[i].logit);
    if (std::isfinite(mx)) {
      const float lg = temp * std::log(min_p);
      const float thr = mx + lg - 1e-3f * (1.0f + std::fabs(mx) + std::fabs(lg));
      if (std::isfinite(thr)) {
        Candidate* mid = std::partition(c, c + n, [thr](const Candidate& x) { return x.logit >= thr; });
        n = std::max(1, (int)(mid - c));  // mx itself always passes
      }
    }
  }
  if (k < n) {
    std::nth_element(c, c + k, c + n, cmp);  // O(n): the k best come first, unordered
    n = k;
  }
  std::sort(c, c + n, cmp);  // O(K log K)

  // Temperature + softmax over the kept, in float; sums in double. e[0] = 1 (the max).
  float* e = probs_.data();
  const float l0 = c[0].logit;
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    const float l = c[j].logit;
    // l == l0 covers the max itself and the degenerate all -inf / several +inf cases.
    const float v = l == l0 ? 1.0f : std::exp((l - l0) / temp);
    e[j] = v;
    sum += v;
  }
  if (min_p > 0.0f) {
    const float thr = min_p * e[0];
    int m = 1;
    double s = e[0];
    while (m < n && e[m] >= thr) s += e[m++];
    n = m;
    sum = s;
  }
  if (params_.top_p < 1.0f) {
    const double target = (double)params_.top_p * sum;
    double cum = 0.0;
    int m = 0;
    while (m < n) {
      cum += e[m++];
      if (cum >= target) break;
    }
    n = m;
    sum = cum;
  }
  kept_sum_ = sum;
  const double inv = 1.0 / sum;
  for (int j = 0; j < n; ++j) e[j] = (float)(e[j] * inv);
  return n;
}

int Sampler::distribution(const float* logits, int32_t* ids, float* probs) {
  if (is_greedy(params_)) {
    ids[0] = argmax(logits);
    probs[0] = 1.0f;
    return 1;
  }
  fill_candidates(logits);
  const int n = build_distribution();
  for (int j = 0; j < n; ++j) {
    ids[j] = cand_[j].id;
    probs[j] = probs_[j];
  }
  return n;
}

int32_t Sampler::sample(const float* logits) {
  if (is_greedy(params_)) return greedy(logits);
  fill_candidates(logits);
  const int n = build_distribution();

  const float* p = probs_.data();
  const double u = next_uniform();
  double total = 0.0;
  for (int j = 0; j < n; ++j) total += p[j];
  const double target = u * total;
  double cum = 0.0;
  int pick = -1;
  for (int j = 0; j < n; ++j) {
    cum += p[j];
    if (target < cum) {
      pick = j;
      break;
    }
  }
  if (pick < 0) {  // rounding at the very top: the last candidate with non-zero probability
    pick = n - 1;
    while (pick > 0 && p[pick] == 0.0f) --pick;
  }

  n_logprobs_ = std::min((int)logprobs_.size(), n);
  if (n_logprobs_ > 0) {
    // log p_j = (l_j - l_0) / T - log(sum of kept exp), with the exponent recomputed in double.
    const double log_sum = std::log(kept_sum_);
    const double l0 = cand_[0].logit, t = params_.temperature;
    for (int j = 0; j < n_logprobs_; ++j) {
      const float l = cand_[j].logit;
      const double d = l == cand_[0].logit ? 0.0 : ((double)l - l0) / t;
      logprobs_[j] = {cand_[j].id, (float)(d - log_sum)};
    }
  }
  return cand_[pick].id;
}

}  // namespace ultra
