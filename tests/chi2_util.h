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

}  // namespace ultra::testing_util
