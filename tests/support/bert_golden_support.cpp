#include "bert_golden_support.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "nn/io/safetensors.h"

namespace ember::testing::bert_golden {

::testing::AssertionResult close_to_golden(const std::string& what, const Tensor& actual, const Tensor& expected,
                                           double tol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": no value (undefined tensor)";
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape()) << " vs golden "
                                         << shape_str(expected.shape());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double scale = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < e.size(); ++i) scale = std::max(scale, std::abs(e[i]));
  for (size_t i = 0; i < e.size(); ++i) {
    const double d = std::abs(a[i] - e[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      worst_at = i;
    }
  }
  const double rel = worst / (scale > 0 ? scale : 1.0);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |diff| / max |golden| = " << rel << " > " << tol
                                       << " (worst at flat index " << worst_at << ": " << a[worst_at]
                                       << " vs golden " << e[worst_at] << ", golden max magnitude " << scale << ")";
}

Golden::Golden(const std::string& dir, const std::string& kind)
    : t(nn::load_safetensors(dir + "/expected_" + kind + ".safetensors")) {}

const Tensor& Golden::at(const std::string& name) const {
  auto it = t.find(name);
  if (it == t.end()) throw std::runtime_error("golden file lacks " + name);
  return it->second;
}

std::vector<std::pair<std::string, Tensor>> Golden::with_prefix(const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [k, v] : t)
    if (k.rfind(prefix, 0) == 0) out.emplace_back(k.substr(prefix.size()), v);
  return out;
}

double max_abs(const Tensor& t) { return amax(abs(t)).item<double>(); }

bool is_key_bias(const std::string& name) { return name.find(".attention.self.key.bias") != std::string::npos; }

void expect_gradients_match(const nn::Module& model, const Golden& g, Device device, double tol,
                            const std::string& label, bool key_bias_is_noise) {
  const auto grads = g.with_prefix("grad.");
  EXPECT_EQ(grads.size(), model.named_parameters().size()) << "the golden file has one gradient per parameter";
  for (const auto& [name, expected] : grads) {
    const Tensor grad = model.parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_EQ(grad.device(), device) << name;
    EXPECT_EQ(grad.dtype(), DType::f32) << name;
    if (is_key_bias(name)) {
      if (!key_bias_is_noise) continue;
      EXPECT_LT(max_abs(grad), 1e-6) << name << " should be rounding noise around zero";
      EXPECT_LT(max_abs(expected), 1e-6) << name;
      continue;
    }
    EXPECT_TRUE(close_to_golden(label + name, grad, expected, tol));
  }
}

}  // namespace ember::testing::bert_golden
