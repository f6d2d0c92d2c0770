#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "sampling/philox.h"

namespace ultra {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline bool is_greedy(const SamplingParams& p) {
  return !(p.temperature > 0.0f);
}

inline int window_len(const SamplingParams& p) {
  const int w = p.repeat_last_n < 0 ? SamplingParams::kMaxHistory : p.repeat_last_n;
  const bool on = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return on ? w : 0;
}

// Candidate order: logit desc, then id asc (a strict total order once NaNs are gone).
template <class C>
inline bool better(const C& a, const C& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

}  // namespace

// Messages name the field and the llama.cpp-style flag that sets it.
void SamplingParams::add_logit_bias(int32_t token, float bias) {
  if (n_logit_bias >= kMaxLogitBias) fail("sampling: logit_bias has more than {} entries", kMaxLogitBias);
  logit_bias[n_logit_bias++] = {token, bias};
}

void SamplingParams::validate(int n_vocab) const {
  auto bad = [](const char* what, const char* flag, double v, const char* want) {
    fail("sampling: {} (--{}) = {} is out of range: {}", what, flag, v, want);
  };
  if (std::isnan(temperature) || temperature < 0)
    bad("temperature", "temp", temperature, ">= 0 (0 is greedy)");
  if (!(top_p > 0 && top_p <= 1)) bad("top_p", "top-p", top_p, "(0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) bad("min_p", "min-p", min_p, "[0, 1]");
  if (!(repeat_penalty > 0) || !std::isfinite(repeat_penalty))
    bad("repeat_penalty", "repeat-penalty", repeat_penalty, "> 0");
  if (!std::isfinite(presence_penalty))
    bad("presence_penalty", "presence-penalty", presence_penalty, "finite");
  if (!std::isfinite(frequency_penalty))
    bad("frequency_penalty", "frequency-penalty", frequency_penalty, "finite");
  if (repeat_last_n < -1)
    bad("repeat_last_n", "repeat-last-n", repeat_last_n, ">= -1 (-1: the whole sequence)");
  if (n_probs < 0 || n_probs > kMaxProbs) bad("n_probs", "n-probs", n_probs, "[0, 20]");
  if (n_logit_bias < 0 || n_logit_bias > kMaxLogitBias)
    fail("sampling: logit_bias has {} entries (at most {})", n_logit_bias, kMaxLogitBias);
  for (int i = 0; i < n_logit_bias; ++i) {
    const LogitBias& b = logit_bias[i];
    if (b.token < 0 || (n_vocab > 0 && b.token >= n_vocab))
      fail("sampling: logit_bias token {} is out of range [0, {})", b.token,
           n_vocab > 0 ? n_vocab : INT32_MAX);
    if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity())
      fail("sampling: logit_bias of token {} is {} (want a number, <= -100 bans)", b.token, b.bias);
  }
}

SamplerScratch::SamplerScratch(int n_vocab) : n_vocab_(n_vocab) {
  if (n_vocab <= 0) fail("sampler: n_vocab must be positive (got {})", n_vocab);
  cand_.resize(n_vocab);
  probs_.resize(n_vocab);
  counts_.assign(n_vocab, 0);
  distinct_.assign(std::min(SamplingParams::kMaxHistory, n_vocab), 0);
}

std::span<const int32_t> penalty_window(const SamplingParams& p, std::span<const int32_t> tokens) {
  const size_t w = (size_t)window_len(p);
  return tokens.size() > w ? tokens.subspan(tokens.size() - w) : tokens;
}

int draw_index(const float* probs, int n, double u) {
  double total = 0.0;
  for (int j = 0; j < n; ++j) total += probs[j];
  const double target = u * total;
  double cum = 0.0;
  for (int j = 0; j < n; ++j) {
    cum += probs[j];
    if (target < cum) return j;
  }
  int j = n - 1;  // rounding at the very top: the last candidate with non-zero probability
  while (j > 0 && probs[j] == 0.0f) --j;
  return j;
}

// The sampling chain over a SamplerScratch (a struct so that it can reach the scratch's members).
struct SamplerImpl {
  using Candidate = SamplerScratch::Candidate;

  const SamplingParams& p;
  SamplerScratch& s;
  int n;  // candidates: ids [0, n)

  // Counts the window's tokens into s.counts_ / s.distinct_ (ids outside [0, n_vocab) are ignored).
  void count(std::span<const int32_t> window) {
    s.n_distinct_ = 0;
    if (window_len(p) == 0) return;
    for (int32_t t : window) {
      if (t < 0 || t >= s.n_vocab_) continue;
      if (s.counts_[t]++ == 0) s.distinct_[s.n_distinct_++] = t;
    }
  }
  void uncount() {
    for (int k = 0; k < s.n_distinct_; ++k) s.counts_[s.distinct_[k]] = 0;
    s.n_distinct_ = 0;
  }

  // out[t] penalised for the counted tokens t.
  void penalise_counted(float* out) const {
    for (int k = 0; k < s.n_distinct_; ++k) {
      const int32_t t = s.distinct_[k];
      out[t] = penalise(out[t], s.counts_[t]);
    }
  }

  void copy_kept(int m, int32_t* ids, float* probs) const {
    for (int j = 0; j < m; ++j) {
      ids[j] = s.cand_[j].id;
      probs[j] = s.probs_[j];
    }
  }

  // count > 0. Same arithmetic as llama.cpp's penalties sampler.
  float penalise(float logit, uint32_t c) const {
    logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
    return logit - ((float)c * p.frequency_penalty + p.presence_penalty);
  }

  // cand[i] = {penalised logit (NaN -> -inf), i} for i < n; returns whether any logit was not finite.
  bool fill(const float* logits) {
    Candidate* c = s.cand_.data();
    bool bad = false;
    for (int i = 0; i < n; ++i) {
      const float v = logits[i];
      bad |= !std::isfinite(v);
      c[i] = {std::isnan(v) ? kNegInf : v, i};
    }
    for (int k = 0; k < s.n_distinct_; ++k) {
      const int32_t t = s.distinct_[k];
      if (t < n) c[t].logit = penalise(c[t].logit, s.counts_[t]);
    }
    return bad;
  }

  // Greedy token in one pass, no copy: strict '>' keeps the lowest id on ties, NaN never wins.
  int32_t argmax(const float* logits, bool* bad) const {
    int32_t best = 0;
    float best_v = kNegInf;
    bool nonfinite = false;
    if (s.n_distinct_ == 0) {
      for (int i = 0; i < n; ++i) {
        const float v = logits[i];
        nonfinite |= !std::isfinite(v);
        if (v > best_v) best_v = v, best = i;
      }
    } else {
      const uint32_t* cnt = s.counts_.data();
      for (int i = 0; i < n; ++i) {
        nonfinite |= !std::isfinite(logits[i]);
        const float v = cnt[i] ? penalise(logits[i], cnt[i]) : logits[i];
        if (v > best_v) best_v = v, best = i;
      }
    }
    *bad = nonfinite;
    return best;
  }

  // Greedy with logprobs: log-softmax at temperature 1 of the penalised logits (log-sum-exp in double).
  SampleResult greedy_logprobs(const float* logits, TokenLogprob* top, int n_top) {
    SampleResult r;
    r.nonfinite = fill(logits);
    Candidate* c = s.cand_.data();
    int32_t best = 0;
    float best_v = c[0].logit;
    for (int i = 1; i < n; ++i)
      if (c[i].logit > best_v) best_v = c[i].logit, best = i;
    const double m = best_v;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
      const float x = c[i].logit;
      sum += x == best_v ? 1.0 : std::exp((double)x - m);
    }
    const double log_sum = std::log(sum);
    r.token = best;
    r.logprob = (float)-log_sum;
    const int k = std::min(n_top, n);
    auto cmp = [](const Candidate& a, const Candidate& b) { return better(a, b); };
    if (k < n) std::nth_element(c, c + k, c + n, cmp);
    std::sort(c, c + k, cmp);
    for (int j = 0; j < k; ++j) {
      const double d = c[j].logit == best_v ? 0.0 : (double)c[j].logit - m;
      top[j] = {c[j].id, (float)(d - log_sum)};
    }
    r.n_top = k;
    return r;
  }

  // On cand (filled): filters and writes the kept probabilities to probs_ (normalised); returns how many.
  int build_distribution() {
    Candidate* c = s.cand_.data();
    auto cmp = [](const Candidate& a, const Candidate& b) { return better(a, b); };
    const float temp = p.temperature;
    const float min_p = p.min_p;
    int m = n;
    const int k = (p.top_k <= 0 || p.top_k >= m) ? m : p.top_k;

    // min-p and top-k are both prefix filters of the same order, so min-p can be applied first as a cheap
    // O(V) pre-filter on logits: exp((l - l_max) / T) >= min_p  <=>  l >= l_max + T log(min_p). The bound
    // is loosened by a margin; the exact test on the probabilities below decides. This keeps top_k = 0
    // cheap.
    if (min_p > 0.0f && min_p <= 1.0f) {
      float mx = kNegInf;
      for (int i = 0; i < m; ++i) mx = std::max(mx, c[i].logit);
      if (std::isfinite(mx)) {
        const float lg = temp * std::log(min_p);
        const float thr = mx + lg - 1e-3f * (1.0f + std::fabs(mx) + std::fabs(lg));
        if (std::isfinite(thr)) {
          Candidate* mid = std::partition(c, c + m, [thr](const Candidate& x) { return x.logit >= thr; });
          m = std::max(1, (int)(mid - c));  // mx itself always passes
        }
      }
    }
    if (k < m) {
      std::nth_element(c, c + k, c + m, cmp);  // O(m): the k best come first, unordered
      m = k;
    }
    std::sort(c, c + m, cmp);  // O(K log K)

    // Temperature + softmax over the kept, in float; sums in double. e[0] = 1 (the max).
    float* e = s.probs_.data();
    const float l0 = c[0].logit;
    double sum = 0.0;
    for (int j = 0; j < m; ++j) {
      const float l = c[j].logit;
      // l == l0 covers the max itself and the degenerate all -inf / several +inf cases.
      const float v = l == l0 ? 1.0f : std::exp((l - l0) / temp);
      e[j] = v;
      sum += v;
    }
    if (min_p > 0.0f) {
      const float thr = min_p * e[0];
      int q = 1;
      double acc = e[0];
      while (q < m && e[q] >= thr) acc += e[q++];
      m = q;
      sum = acc;
    }
    if (p.top_p < 1.0f) {
      const double target = (double)p.top_p * sum;
      double cum = 0.0;
      int q = 0;
      while (q < m) {
        cum += e[q++];
        if (cum >= target) break;
      }
      m = q;
      sum = cum;
    }
    s.kept_sum_ = sum;
    const double inv = 1.0 / sum;
    for (int j = 0; j < m; ++j) e[j] = (float)(e[j] * inv);
    return m;
  }

  SampleResult draw(const float* logits, int64_t position, TokenLogprob* top, int n_top) {
    SampleResult r;
    r.nonfinite = fill(logits);
    const int m = build_distribution();
    const float* pr = s.probs_.data();
    const int pick = draw_index(pr, m, philox_uniform(p.seed, position, DrawStream::token));
    // log p_j = (l_j - l_0) / T - log(sum of kept exp), with the exponent recomputed in double.
    const Candidate* c = s.cand_.data();
    const double log_sum = std::log(s.kept_sum_);
    const double l0 = c[0].logit, t = p.temperature;
    auto logp = [&](int j) {
      const double d = c[j].logit == c[0].logit ? 0.0 : ((double)c[j].logit - l0) / t;
      return (float)(d - log_sum);
    };
    r.token = c[pick].id;
    r.logprob = logp(pick);
    r.n_top = std::min(n_top, m);
    for (int j = 0; j < r.n_top; ++j) top[j] = {c[j].id, logp(j)};
    return r;
  }
};

bool apply_logit_rules(const SamplingParams& p, const uint32_t* allow, float* logits, int n_sample) {
  bool bad = false;
  for (int i = 0; i < n_sample; ++i) bad |= !std::isfinite(logits[i]);
  if (allow) {
    for (int i = 0; i < n_sample; ++i)
      if (!((allow[(uint32_t)i >> 5] >> (i & 31)) & 1u)) logits[i] = kNegInf;
  }
  for (int k = 0; k < p.n_logit_bias; ++k) {
    const LogitBias& b = p.logit_bias[k];
    if (b.token < 0 || b.token >= n_sample) continue;
    logits[b.token] = b.bias <= -100.0f ? kNegInf : logits[b.token] + b.bias;
  }
  return bad;
}

SampleResult sample_row(const SamplingParams& p, const float* logits, int n_sample,
                        std::span<const int32_t> window, int64_t position, SamplerScratch& s,
                        TokenLogprob* top) {
  SamplerImpl im{p, s, std::clamp(n_sample, 1, s.n_vocab())};
  const int n_top = std::clamp(p.n_probs, 0, SamplingParams::kMaxProbs);
  im.count(window);
  SampleResult r;
  if (is_greedy(p)) {
    if (n_top > 0) {
      r = im.greedy_logprobs(logits, top, n_top);
    } else {
      r.token = im.argmax(logits, &r.nonfinite);
      r.logprob = std::numeric_limits<float>::quiet_NaN();  // would cost a pass of exp over the vocabulary
    }
  } else {
    r = im.draw(logits, position, top, n_top);
  }
  im.uncount();
  return r;
}

int sample_distribution(const SamplingParams& p, const float* logits, int n_sample,
                        std::span<const int32_t> window, SamplerScratch& s, int32_t* ids, float* probs) {
  SamplerImpl im{p, s, std::clamp(n_sample, 1, s.n_vocab())};
  im.count(window);
  int m = 1;
  if (is_greedy(p)) {
    bool bad;
    ids[0] = im.argmax(logits, &bad);
    probs[0] = 1.0f;
  } else {
    im.fill(logits);
    m = im.build_distribution();
    im.copy_kept(m, ids, probs);
  }
  im.uncount();
  return m;
}

void apply_penalties(const SamplingParams& p, const float* logits, std::span<const int32_t> window,
                     SamplerScratch& s, float* out) {
  SamplerImpl im{p, s, s.n_vocab()};
  std::copy(logits, logits + s.n_vocab(), out);
  im.count(window);
  im.penalise_counted(out);
  im.uncount();
}

// ---- Sampler ----

Sampler::Sampler(const SamplingParams& params, int n_vocab)
    : params_(params), scratch_(n_vocab), window_(window_len(params)) {
  history_.assign((size_t)2 * window_, 0);
}

std::span<const int32_t> Sampler::window() const {
  const int n = std::min(hist_len_, window_);
  return {history_.data() + hist_len_ - n, (size_t)n};
}

void Sampler::accept(int32_t token) {
  if (window_ == 0 || token < 0 || token >= n_vocab()) return;
  if (hist_len_ == (int)history_.size()) {  // full: keep the last window_ tokens, at the front
    std::copy(history_.end() - window_, history_.end(), history_.begin());
    hist_len_ = window_;
  }
  history_[hist_len_++] = token;
}

void Sampler::reset() {
  hist_len_ = 0;
  counter_ = 0;
  last_ = {};
}

int32_t Sampler::sample(const float* logits) {
  last_ = sample_row(params_, logits, n_vocab(), window(), counter_++, scratch_, top_);
  return last_.token;
}

int Sampler::distribution(const float* logits, int32_t* ids, float* probs) {
  return sample_distribution(params_, logits, n_vocab(), window(), scratch_, ids, probs);
}

void Sampler::apply_penalties(const float* logits, float* out) {
  ultra::apply_penalties(params_, logits, window(), scratch_, out);
}

}  // namespace ultra
