// Chi-square goodness of fit for the sampling tests.
#pragma once

#include <cmath>
#include <vector>

namespace ultra::testing_util {

// 0.999 quantile of the chi-square distribution with k degrees of freedom (Wilson-Hilferty; within 0.2 of the
// exact value for k >= 1).
inline double chi2_quantile_999(int k) {
  const double z = 3.090232306167813;  // standard normal 0.999 quantile
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// sum (observed - n p)^2 / (n p) over the categories.
inline double chi2_statistic(const std::vector<long>& observed, const std::vector<double>& p, long n) {
  double s = 0.0;
  for (size_t j = 0; j < p.size(); ++j) {
    const double e = p[j] * (double)n;
    s += (observed[j] - e) * (observed[j] - e) / e;
  }
  return s;
}

// The goodness of fit of counts[x] (n draws) to probabilities p[x]: categories with an expected count >= 5,
// the rest pooled into one; the statistic, its 0.999 quantile and the number of categories.
struct Chi2Fit {
  double chi2 = 0, crit = 0;
  size_t categories = 0;
};
inline Chi2Fit chi2_fit(const std::vector<long>& counts, const std::vector<double>& p, long n) {
  std::vector<long> obs;
  std::vector<double> exp;
  long rest_obs = 0;
  double rest_p = 0;
  for (size_t x = 0; x < p.size(); ++x) {
    if (p[x] * n >= 5) {
      obs.push_back(counts[x]);
      exp.push_back(p[x]);
    } else {
      rest_obs += counts[x];
      rest_p += p[x];
    }
  }
  if (rest_p > 0) {
    obs.push_back(rest_obs);
    exp.push_back(rest_p);
  }
  return {chi2_statistic(obs, exp, n), chi2_quantile_999((int)obs.size() - 1), obs.size()};
}

}  // namespace ultra::testing_util
