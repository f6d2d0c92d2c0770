#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

#include "alloc_counter.h"
#include "chi2_util.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"

using namespace ultra;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Test-local RNG (splitmix64), independent of the sampler's.
struct TestRng {
  uint64_t x;
  explicit TestRng(uint64_t seed) : x(seed) {}
  uint64_t next() {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

std::vector<float> random_logits(int n, uint64_t seed, double sd = 3.0, bool ties = false) {
  TestRng rng(seed);
  std::vector<float> l(n);
  for (float& v : l) {
    double x = sd * rng.normal();
    if (ties) x = std::round(x * 4.0) / 4.0;  // many exact ties
    v = (float)x;
  }
  return l;
}

SamplingParams sampled_params(float temp, int top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

struct RefDist {
  std::vector<int32_t> ids;
  std::vector<double> p;
};

void renormalise(std::vector<double>& p) {
  double s = 0.0;
  for (double v : p) s += v;
  for (double& v : p) v /= s;
}

// Plain float64 reference: sort all V by logit (ties: lower id first), top-k, temperature, softmax,
// min-p, renormalise, top-p, renormalise. No penalties (callers pass already-penalised logits).
RefDist reference(const std::vector<float>& logits, const SamplingParams& sp) {
  const int V = (int)logits.size();
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (logits[a] != logits[b]) return logits[a] > logits[b];
    return a < b;
  });
  const int k = (sp.top_k <= 0 || sp.top_k >= V) ? V : sp.top_k;
  order.resize(k);
  RefDist r;
  r.ids = order;
  const double t = sp.temperature;
  const double mx = (double)logits[order[0]] / t;
  for (int j = 0; j < k; ++j) r.p.push_back(std::exp((double)logits[order[j]] / t - mx));
  renormalise(r.p);
  if (sp.min_p > 0.0f) {
    const double thr = (double)sp.min_p * r.p[0];
    RefDist f;
    for (size_t j = 0; j < r.p.size(); ++j) {
      if (r.p[j] >= thr) f.ids.push_back(r.ids[j]), f.p.push_back(r.p[j]);
    }
    r = f;
    renormalise(r.p);
  }
  if (sp.top_p < 1.0f) {
    double cum = 0.0;
    size_t m = 0;
    while (m < r.p.size()) {
      cum += r.p[m++];
      if (cum >= (double)sp.top_p) break;
    }
    r.ids.resize(m);
    r.p.resize(m);
    renormalise(r.p);
  }
  return r;
}

// 0.999 quantile of chi-square with k degrees of freedom (Wilson-Hilferty).
using testing_util::chi2_quantile_999;
using testing_util::chi2_statistic;

int32_t ref_argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (int i = 1; i < (int)l.size(); ++i) {
    if (l[i] > l[best]) best = i;
  }
  return best;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Greedy

TEST(Sampler, GreedyIsArgmaxAndIgnoresOtherParams) {
  for (int V : {1, 7, 1000, 32000}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      const auto l = random_logits(V, seed * 77 + V);
      for (float temp : {0.0f, -1.0f}) {
        SamplingParams p = sampled_params(temp, 1, 0.1f, 0.9f);
        p.top_k = (int)seed % 3;  // irrelevant for greedy
        Sampler s(p, V);
        EXPECT_EQ(s.sample(l.data()), ref_argmax(l)) << V << " " << seed;
        EXPECT_EQ(s.n_logprobs(), 0);
        int32_t id;
        float pr;
        EXPECT_EQ(s.distribution(l.data(), &id, &pr), 1);
        EXPECT_EQ(id, ref_argmax(l));
        EXPECT_EQ(pr, 1.0f);
      }
    }
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, (int)l.size());
  EXPECT_EQ(s.sample(l.data()), 1);
  std::vector<float> all_equal(100, -0.25f);
  Sampler s2(p, 100);
  EXPECT_EQ(s2.sample(all_equal.data()), 0);
  std::vector<float> with_nan = {std::nanf(""), -kInf, 2.0f, std::nanf(""), 2.0f};
  Sampler s3(p, 5);
  EXPECT_EQ(s3.sample(with_nan.data()), 2);
}

TEST(Sampler, GreedyDoesNotUseRng) {
  // A greedy sampler is deterministic regardless of the seed, and top_k = 1 sampling matches it.
  const auto l = random_logits(500, 3);
  SamplingParams g;
  g.temperature = 0.0f;
  SamplingParams k1 = sampled_params(1.3f, 1, 0.9f, 0.05f);
  for (uint64_t seed : {1ULL, 2ULL, 99ULL}) {
    g.seed = k1.seed = seed;
    Sampler sg(g, 500), sk(k1, 500);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(sg.sample(l.data()), ref_argmax(l));
      EXPECT_EQ(sk.sample(l.data()), ref_argmax(l));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Filtered distribution against the full-sort float64 reference

void check_distribution_matches_reference(int V, uint64_t seed, bool ties) {
  const auto l = random_logits(V, seed, 3.0, ties);
  std::vector<int32_t> ids(V);
  std::vector<float> probs(V);
  int n_checked = 0;
  for (int top_k : {1, 5, 40, 0}) {
    for (float top_p : {1.0f, 0.9f, 0.5f}) {
      for (float min_p : {0.0f, 0.05f, 0.2f}) {
        for (float temp : {0.5f, 1.0f, 1.5f}) {
          const SamplingParams sp = sampled_params(temp, top_k, top_p, min_p);
          Sampler s(sp, V);
          const RefDist r = reference(l, sp);
          const int n = s.distribution(l.data(), ids.data(), probs.data());
          const std::string what = "V=" + std::to_string(V) + " k=" + std::to_string(top_k) +
                                   " p=" + std::to_string(top_p) + " minp=" + std::to_string(min_p) +
                                   " T=" + std::to_string(temp) + (ties ? " ties" : "");
          ASSERT_EQ(n, (int)r.ids.size()) << what;
          double sum = 0.0;
          for (int j = 0; j < n; ++j) {
            ASSERT_EQ(ids[j], r.ids[j]) << what << " j=" << j;
            ASSERT_NEAR(probs[j], r.p[j], 1e-6) << what << " j=" << j;
            sum += probs[j];
          }
          EXPECT_NEAR(sum, 1.0, 1e-5) << what;
          // sample() uses the same path: whatever it draws is in the kept set.
          for (int d = 0; d < 20; ++d) {
            const int32_t t = s.sample(l.data());
            EXPECT_NE(std::find(r.ids.begin(), r.ids.end(), t), r.ids.end()) << what;
          }
          ++n_checked;
        }
      }
    }
  }
  EXPECT_EQ(n_checked, 108);
}

TEST(Sampler, DistributionMatchesFullSortReferenceV1000) {
  for (uint64_t seed : {11ULL, 12ULL, 13ULL}) check_distribution_matches_reference(1000, seed, false);
}

TEST(Sampler, DistributionMatchesFullSortReferenceV1000Ties) {
  check_distribution_matches_reference(1000, 21, true);
}

TEST(Sampler, DistributionMatchesFullSortReferenceV32000) {
  check_distribution_matches_reference(32000, 31, false);
}

TEST(Sampler, DistributionEdgeCases) {
  std::vector<int32_t> ids(8);
  std::vector<float> probs(8);
  // top_k >= n_vocab keeps all; min_p = 0, top_p = 1: the plain softmax.
  {
    std::vector<float> l = {0.0f, 1.0f, 2.0f, 3.0f};
    Sampler s(sampled_params(1.0f, 10, 1.0f, 0.0f), 4);
    ASSERT_EQ(s.distribution(l.data(), ids.data(), probs.data()), 4);
    const double z = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    EXPECT_EQ(ids[0], 3);
    EXPECT_NEAR(probs[0], std::exp(3.0) / z, 1e-7);
    EXPECT_EQ(ids[3], 0);
    EXPECT_NEAR(probs[3], 1.0 / z, 1e-7);
  }
  // -inf and NaN logits never get probability; a single +inf takes it all.
  {
    std::vector<float> l = {-kInf, std::nanf(""), 1.0f, -kInf, 0.0f};
    Sampler s(sampled_params(1.0f, 0, 1.0f, 0.0f), 5);
    const int n = s.distribution(l.data(), ids.data(), probs.data());
    ASSERT_GE(n, 2);
    EXPECT_EQ(ids[0], 2);
    EXPECT_EQ(ids[1], 4);
    for (int j = 2; j < n; ++j) EXPECT_EQ(probs[j], 0.0f);
    for (int d = 0; d < 1000; ++d) {
      const int32_t t = s.sample(l.data());
      EXPECT_TRUE(t == 2 || t == 4) << t;
    }
    std::vector<float> l2 = {0.0f, kInf, 5.0f};
    Sampler s2(sampled_params(1.0f, 0, 1.0f, 0.05f), 3);
    ASSERT_EQ(s2.distribution(l2.data(), ids.data(), probs.data()), 1);
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(probs[0], 1.0f);
  }
  // top_p = 0 and min_p = 1 keep exactly the best.
  {
    std::vector<float> l = {0.5f, 0.4f, 0.3f};
    Sampler s(sampled_params(1.0f, 0, 0.0f, 0.0f), 3);
    ASSERT_EQ(s.distribution(l.data(), ids.data(), probs.data()), 1);
    EXPECT_EQ(ids[0], 0);
    Sampler s2(sampled_params(1.0f, 0, 1.0f, 1.0f), 3);
    ASSERT_EQ(s2.distribution(l.data(), ids.data(), probs.data()), 1);
    EXPECT_EQ(ids[0], 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Multinomial draws

struct Chi2Result {
  double stat_true, stat_wrong, quantile;
  bool outside;
};

Chi2Result chi2_run(const SamplingParams& sp, const std::vector<float>& l, const RefDist& wrong) {
  const int V = (int)l.size();
  const RefDist r = reference(l, sp);
  std::vector<int32_t> pos(V, -1);
  for (size_t j = 0; j < r.ids.size(); ++j) pos[r.ids[j]] = (int32_t)j;
  Sampler s(sp, V);
  const long n = 200000;
  std::vector<long> obs(r.ids.size(), 0);
  bool outside = false;
  for (long d = 0; d < n; ++d) {
    const int32_t t = s.sample(l.data());
    if (pos[t] < 0) {
      outside = true;
      continue;
    }
    ++obs[pos[t]];
  }
  EXPECT_EQ(wrong.ids, r.ids);
  return {chi2_statistic(obs, r.p, n), chi2_statistic(obs, wrong.p, n),
          chi2_quantile_999((int)r.ids.size() - 1), outside};
}

TEST(Sampler, ChiSquareGoodnessOfFit) {
  const auto l = random_logits(50, 5, 1.0);
  // top-k only: K = 20 categories.
  {
    SamplingParams sp = sampled_params(1.0f, 20, 1.0f, 0.0f);
    sp.seed = 12345;
    // The wrong distribution: the same candidates at temperature 1.1 (a small but real difference).
    SamplingParams wp = sp;
    wp.temperature = 1.1f;
    const Chi2Result c = chi2_run(sp, l, reference(l, wp));
    EXPECT_FALSE(c.outside);
    EXPECT_LT(c.stat_true, c.quantile) << "chi2 " << c.stat_true << " vs " << c.quantile;
    EXPECT_GT(c.stat_wrong, c.quantile) << "wrong distribution not detected: " << c.stat_wrong;
    std::printf("chi2 (k=20): %.2f (wrong: %.2f), 0.999 quantile %.2f\n", c.stat_true, c.stat_wrong,
                c.quantile);
  }
  // Every filter on, different temperature and seed.
  {
    SamplingParams sp = sampled_params(0.7f, 30, 0.95f, 0.02f);
    sp.seed = 777;
    // The wrong distribution: the right one with 1% of the mass moved from the best to the second best.
    RefDist w = reference(l, sp);
    ASSERT_GE(w.p.size(), 3u);
    w.p[0] -= 0.01;
    w.p[1] += 0.01;
    const Chi2Result c = chi2_run(sp, l, w);
    EXPECT_FALSE(c.outside);
    EXPECT_LT(c.stat_true, c.quantile) << "chi2 " << c.stat_true << " vs " << c.quantile;
    EXPECT_GT(c.stat_wrong, c.quantile) << "wrong distribution not detected: " << c.stat_wrong;
    std::printf("chi2 (k=%zu): %.2f (wrong: %.2f), 0.999 quantile %.2f\n", w.ids.size(), c.stat_true,
                c.stat_wrong, c.quantile);
  }
}

TEST(Sampler, WilsonHilfertyQuantileIsSane) {
  // Known values: chi2 0.999 quantiles for 1, 19, 29 dof are 10.828, 43.820, 58.301.
  EXPECT_NEAR(chi2_quantile_999(19), 43.820, 0.15);
  EXPECT_NEAR(chi2_quantile_999(29), 58.301, 0.15);
  EXPECT_NEAR(chi2_quantile_999(100), 149.449, 0.15);
}

std::vector<int32_t> draw_sequence(Sampler& s, const std::vector<float>& l, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(l.data()));
  return out;
}

TEST(Sampler, SeedReproducibility) {
  const auto l = random_logits(100, 9, 1.0);
  SamplingParams sp = sampled_params(1.0f, 0, 1.0f, 0.0f);
  sp.seed = 42;
  Sampler a(sp, 100), b(sp, 100);
  const auto sa = draw_sequence(a, l, 500);
  EXPECT_EQ(sa, draw_sequence(b, l, 500));
  sp.seed = 43;
  Sampler c(sp, 100);
  const auto sc = draw_sequence(c, l, 500);
  EXPECT_NE(sa, sc);
  int same = 0;
  for (int i = 0; i < 500; ++i) same += sa[i] == sc[i];
  EXPECT_LT(same, 100);  // the two streams are unrelated, not shifted copies
  // reset() restarts the stream; distribution() does not consume it.
  a.reset();
  std::vector<int32_t> ids(100);
  std::vector<float> probs(100);
  a.distribution(l.data(), ids.data(), probs.data());
  EXPECT_EQ(sa, draw_sequence(a, l, 500));
  // The stream is not the same for the first draws after reset if we skip one.
  a.reset();
  a.sample(l.data());
  EXPECT_NE(sa, draw_sequence(a, l, 500));
}

// ---------------------------------------------------------------------------------------------------
// Penalties

TEST(Sampler, PenaltiesHandComputed) {
  const std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f, 0.0f, 4.0f};
  std::vector<float> out(8);
  // Repetition penalty only: positive / 2, non-positive * 2, once per distinct token.
  {
    SamplingParams p;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 4;
    Sampler s(p, 8);
    for (int32_t t : {3, 1, 3, 6}) s.accept(t);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, (std::vector<float>{2.0f, -2.0f, 0.5f, 1.5f, -2.0f, 1.0f, 0.0f, 4.0f}));
  }
  // Presence only: subtract once per distinct token.
  {
    SamplingParams p;
    p.presence_penalty = 0.5f;
    p.repeat_last_n = 4;
    Sampler s(p, 8);
    for (int32_t t : {3, 1, 3, 6}) s.accept(t);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, (std::vector<float>{2.0f, -1.5f, 0.5f, 2.5f, -2.0f, 1.0f, -0.5f, 4.0f}));
  }
  // Frequency only: subtract count * f.
  {
    SamplingParams p;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 4;
    Sampler s(p, 8);
    for (int32_t t : {3, 1, 3, 6}) s.accept(t);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, (std::vector<float>{2.0f, -1.25f, 0.5f, 2.5f, -2.0f, 1.0f, -0.25f, 4.0f}));
  }
  // All three, and the window sliding.
  {
    SamplingParams p;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 4;
    p.temperature = 0.0f;
    Sampler s(p, 8);
    for (int32_t t : {3, 1, 3, 6}) s.accept(t);  // window [3 1 3 6]
    EXPECT_EQ(s.history_size(), 4);
    s.apply_penalties(l.data(), out.data());
    // 3: 3/2 - (2*0.25 + 0.5) = 0.5; 1: -1*2 - 0.75 = -2.75; 6: 0*2 - 0.75 = -0.75
    EXPECT_EQ(out, (std::vector<float>{2.0f, -2.75f, 0.5f, 0.5f, -2.0f, 1.0f, -0.75f, 4.0f}));
    EXPECT_EQ(s.sample(l.data()), 7);
    s.accept(7);  // window [1 3 6 7]: one 3 left the window
    s.apply_penalties(l.data(), out.data());
    // 3: 1.5 - 0.75 = 0.75; 7: 4/2 - 0.75 = 1.25
    EXPECT_EQ(out, (std::vector<float>{2.0f, -2.75f, 0.5f, 0.75f, -2.0f, 1.0f, -0.75f, 1.25f}));
    EXPECT_EQ(s.sample(l.data()), 0);         // 2.0 is now the best
    for (int32_t t : {2, 2, 2}) s.accept(t);  // window [7 2 2 2]: 1, 3, 6 are no longer penalised
    EXPECT_EQ(s.history_size(), 4);
    s.apply_penalties(l.data(), out.data());
    // 2: 0.5/2 - (3*0.25 + 0.5) = -1.0
    EXPECT_EQ(out, (std::vector<float>{2.0f, -1.0f, -1.0f, 3.0f, -2.0f, 1.0f, 0.0f, 1.25f}));
    EXPECT_EQ(s.sample(l.data()), 3);
    // The sampled path sees the same penalised logits.
    s.reset();
    EXPECT_EQ(s.history_size(), 0);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, l);
    EXPECT_EQ(s.sample(l.data()), 7);
  }
}

TEST(Sampler, PenaltiesFeedTheSampledDistribution) {
  const auto l = random_logits(300, 17, 2.0);
  SamplingParams p = sampled_params(0.8f, 40, 0.9f, 0.05f);
  p.repeat_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  p.repeat_last_n = 16;
  Sampler s(p, 300);
  std::vector<int32_t> ids(300);
  std::vector<float> probs(300), pen(300);
  TestRng rng(5);
  for (int step = 0; step < 100; ++step) {
    // Accept a mix of the current favourites and random tokens.
    s.accept(step % 3 ? ref_argmax(l) : (int32_t)(rng.next() % 300));
    s.apply_penalties(l.data(), pen.data());
    const RefDist r = reference(pen, p);
    const int n = s.distribution(l.data(), ids.data(), probs.data());
    ASSERT_EQ(n, (int)r.ids.size()) << step;
    for (int j = 0; j < n; ++j) {
      ASSERT_EQ(ids[j], r.ids[j]) << step;
      ASSERT_NEAR(probs[j], r.p[j], 1e-6) << step;
    }
  }
}

// apply_penalties() against a reference that rescans the window, over a long random stream.
TEST(Sampler, PenaltyCountsTrackSlidingWindow) {
  const int V = 20;
  std::vector<float> l(V);
  for (int i = 0; i < V; ++i) l[i] = (float)(i - 10) * 0.5f;
  for (int window : {1, 5, 64}) {
    SamplingParams p;
    p.repeat_penalty = 1.5f;
    p.presence_penalty = 0.25f;
    p.frequency_penalty = 0.125f;
    p.repeat_last_n = window;
    Sampler s(p, V);
    std::vector<int32_t> hist;
    std::vector<float> out(V);
    TestRng rng(window);
    for (int step = 0; step < 500; ++step) {
      const int32_t t = (int32_t)(rng.next() % 7) * 3 % V;
      s.accept(t);
      hist.push_back(t);
      s.apply_penalties(l.data(), out.data());
      std::vector<int> cnt(V, 0);
      for (size_t i = hist.size() > (size_t)window ? hist.size() - window : 0; i < hist.size(); ++i) {
        ++cnt[hist[i]];
      }
      for (int i = 0; i < V; ++i) {
        float e = l[i];
        if (cnt[i] > 0) {
          e = e > 0 ? e / 1.5f : e * 1.5f;
          e -= (float)cnt[i] * 0.125f + 0.25f;
        }
        ASSERT_EQ(out[i], e) << "window " << window << " step " << step << " token " << i;
      }
    }
  }
}

TEST(Sampler, PenaltyWindowOffAndWholeHistory) {
  const std::vector<float> l = {1.0f, 2.0f, 3.0f};
  std::vector<float> out(3);
  SamplingParams p;
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 0;  // off
  {
    Sampler s(p, 3);
    for (int i = 0; i < 10; ++i) s.accept(2);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, l);
    EXPECT_EQ(s.history_size(), 0);
  }
  p.repeat_last_n = -1;  // whole history, up to kMaxHistory tokens
  {
    Sampler s(p, 3);
    s.accept(0);
    for (int i = 0; i < 1000; ++i) s.accept(1);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, 3.0f}));
    for (int i = 0; i < Sampler::kMaxHistory - 1001; ++i) s.accept(1);
    EXPECT_EQ(s.history_size(), Sampler::kMaxHistory);
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out[0], 0.5f);  // still the oldest token in the window
    s.accept(1);              // token 0 leaves
    s.apply_penalties(l.data(), out.data());
    EXPECT_EQ(out, (std::vector<float>{1.0f, 1.0f, 3.0f}));
  }
  // Out-of-range tokens are ignored.
  p.repeat_last_n = 4;
  {
    Sampler s(p, 3);
    s.accept(-1);
    s.accept(3);
    s.accept(1000000);
    EXPECT_EQ(s.history_size(), 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Log-probabilities

TEST(Sampler, GreedyLogprobsMatchLogSoftmax) {
  const int V = 1000;
  const auto l = random_logits(V, 23, 3.0);
  SamplingParams p;
  p.temperature = 0.0f;
  p.n_probs = 7;
  p.repeat_penalty = 1.2f;
  p.presence_penalty = 0.3f;
  p.repeat_last_n = 8;
  Sampler s(p, V);
  const int32_t top = ref_argmax(l);
  s.accept(top);
  s.accept(5);
  std::vector<float> pen(V);
  s.apply_penalties(l.data(), pen.data());
  // float64 log-softmax of the penalised logits.
  double mx = -1e300;
  for (float v : pen) mx = std::max(mx, (double)v);
  double sum = 0.0;
  for (float v : pen) sum += std::exp((double)v - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pen[a] > pen[b]; });

  const int32_t t = s.sample(l.data());
  EXPECT_EQ(t, order[0]);
  ASSERT_EQ(s.n_logprobs(), 7);
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(s.logprobs()[j].token, order[j]) << j;
    EXPECT_NEAR(s.logprobs()[j].logprob, (double)pen[order[j]] - lse, 1e-5) << j;
    if (j > 0) {
      EXPECT_GE(s.logprobs()[j - 1].logprob, s.logprobs()[j].logprob);
    }
  }
}

TEST(Sampler, SampledLogprobsMatchFinalDistribution) {
  const int V = 2000;
  const auto l = random_logits(V, 29, 2.0);
  // n_probs is at most kMaxProbs (20); with top_k = 15 every kept candidate is reported.
  for (auto [n_probs, top_k] :
       {std::pair{1, 40}, {5, 40}, {SamplingParams::kMaxProbs, 40}, {SamplingParams::kMaxProbs, 15}}) {
    SamplingParams p = sampled_params(0.7f, top_k, 0.9f, 0.02f);
    p.n_probs = n_probs;
    Sampler s(p, V);
    const RefDist r = reference(l, p);
    for (int d = 0; d < 5; ++d) {
      const int32_t t = s.sample(l.data());
      EXPECT_NE(std::find(r.ids.begin(), r.ids.end(), t), r.ids.end());
      const int expect_n = std::min(n_probs, (int)r.ids.size());
      ASSERT_EQ(s.n_logprobs(), expect_n);
      double mass = 0.0;
      for (int j = 0; j < expect_n; ++j) {
        EXPECT_EQ(s.logprobs()[j].token, r.ids[j]) << j;
        EXPECT_NEAR(s.logprobs()[j].logprob, std::log(r.p[j]), 1e-5) << j;
        if (j > 0) {
          EXPECT_GE(s.logprobs()[j - 1].logprob, s.logprobs()[j].logprob);
        }
        mass += std::exp((double)s.logprobs()[j].logprob);
      }
      if (top_k == 15) {
        ASSERT_EQ(expect_n, (int)r.ids.size());
        EXPECT_NEAR(mass, 1.0, 1e-5);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// No allocation in the decode loop

TEST(Sampler, SampleAndAcceptDoNotAllocate) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const int V = 32000;
  const auto l = random_logits(V, 41, 3.0);
  std::vector<SamplingParams> configs;
  configs.push_back(sampled_params(0.0f, 40, 0.95f, 0.05f));  // greedy
  configs.push_back(sampled_params(0.8f, 40, 0.95f, 0.05f));  // defaults-like
  configs.push_back(sampled_params(1.0f, 0, 0.9f, 0.0f));     // full sort
  configs.push_back(sampled_params(1.0f, 0, 1.0f, 0.05f));    // min-p pre-filter
  for (SamplingParams& p : configs) {
    p.repeat_penalty = 1.1f;
    p.frequency_penalty = 0.1f;
    p.repeat_last_n = -1;
  }
  SamplingParams g = configs[0];
  g.n_probs = 10;
  configs.push_back(g);
  SamplingParams sl = configs[1];
  sl.n_probs = 10;
  configs.push_back(sl);
  {
    AllocCount count;
    Sampler s(configs[0], V);
    EXPECT_GT(count.allocs(), 0) << "the allocation counter does not count";
  }
  for (const SamplingParams& p : configs) {
    Sampler s(p, V);
    std::vector<int32_t> ids(V);
    std::vector<float> probs(V);
    AllocCount count;
    for (int step = 0; step < 200; ++step) {
      const int32_t t = s.sample(l.data());
      s.accept(t);
      s.accept((int32_t)(step * 7919 % V));
    }
    s.distribution(l.data(), ids.data(), probs.data());
    s.reset();
    s.accept(1);
    s.sample(l.data());
    count.stop();
    EXPECT_EQ(count.allocs(), 0) << "temperature " << p.temperature << " n_probs " << p.n_probs;
  }
}

// ---------------------------------------------------------------------------------------------------
// The counter-based generator: Random123's known answers for Philox4x32-10, and the uniform's range.

TEST(Philox, KnownAnswers) {
  const Philox4 a = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  const Philox4 b = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[1], 0x41c83b0eu);
  EXPECT_EQ(b.v[2], 0xa20bc7c6u);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  const Philox4 c = philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
}

TEST(Philox, UniformIsInRangeAndKeyedBySeedPositionStream) {
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform(7, i, DrawStream::token);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // 5 standard errors of a uniform mean (0.29 / sqrt(n))
  EXPECT_EQ(philox_uniform(7, 5, DrawStream::token), philox_uniform(7, 5, DrawStream::token));
  EXPECT_NE(philox_uniform(7, 5, DrawStream::token), philox_uniform(8, 5, DrawStream::token));
  EXPECT_NE(philox_uniform(7, 5, DrawStream::token), philox_uniform(7, 6, DrawStream::token));
  EXPECT_NE(philox_uniform(7, 5, DrawStream::token), philox_uniform(7, 5, DrawStream::accept));
  EXPECT_NE(philox_uniform(7, 5, DrawStream::token),
            philox_uniform(7, int64_t(5) + (int64_t(1) << 32), DrawStream::token));
}
