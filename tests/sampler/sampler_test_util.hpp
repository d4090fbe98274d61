// tests/sampler/sampler_test_util.hpp: reference softmax and binomial bounds
// shared by the sampler tests (message capture is in fixtures.hpp).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "fixtures.hpp"  // invalid_argument_message
#include "kestrel/core/error.hpp"

namespace kestrel::test {

/// softmax(logits / t) in double, written independently of the library.
inline std::vector<double> softmax_ref(const std::vector<float>& logits, double t = 1.0) {
  double m = -INFINITY;
  for (float l : logits) m = std::max(m, double(l));
  std::vector<double> p(logits.size());
  double s = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) s += p[i] = std::exp((double(logits[i]) - m) / t);
  for (auto& x : p) x /= s;
  return p;
}

/// Logits whose softmax is `probs` (up to rounding).
inline std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? float(std::log(p)) : -INFINITY);
  return l;
}

/// The count of a token drawn n times with probability p is Binomial(n, p):
/// mean n p, standard deviation sqrt(n p (1-p)). A 5-sigma band is left by
/// chance with probability ~6e-7 per token under the normal approximation
/// (n p >= 100 in every use here), so a failure means a wrong distribution,
/// not bad luck; with fixed seeds the outcome is deterministic anyway.
inline void check_binomial(std::size_t count, std::size_t n, double p, std::size_t token) {
  const double mean = double(n) * p;
  const double sigma = std::sqrt(double(n) * p * (1.0 - p));
  INFO("token " << token << ": count " << count << ", expected " << mean << " +- 5*" << sigma);
  CHECK(std::abs(double(count) - mean) <= 5.0 * sigma + 1e-9);
}

}  // namespace kestrel::test
