// What the BERT golden tests (tests/nn/test_bert_golden.cpp on the CPU, its GPU twin in
// tests/cuda/test_cuda_bert_golden.cpp) share: where the transformers checkpoints and golden
// outputs live, loading them, running a model on the golden batch, and comparing a tensor
// with its golden value.
//
// Errors are measured as max |actual - expected| / max |expected| over a tensor, which stays
// meaningful for tensors with elements near zero.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "nn/models/bert.h"

namespace ember::testing::bert_golden {

// The generating script checks float32 against float64 to 1e-5; 1e-4 leaves room for rounding.
constexpr double kTol = 1e-4;
constexpr int kAdamWSteps = 3;

// Test executables are compiled with EMBER_SOURCE_DIR; the support library is not.
#ifdef EMBER_SOURCE_DIR
inline std::string golden_dir() { return std::string(EMBER_SOURCE_DIR) + "/tests/golden/bert"; }
#endif

// max |actual - expected| / max |expected| (absolute when expected is all zero) <= tol.
// Either tensor may live on any device.
::testing::AssertionResult close_to_golden(const std::string& what, const Tensor& actual, const Tensor& expected,
                                           double tol = kTol);

// The golden outputs of one model kind ("mlm" or "cls"): <dir>/expected_<kind>.safetensors.
struct Golden {
  std::map<std::string, Tensor> t;
  Golden(const std::string& dir, const std::string& kind);
#ifdef EMBER_SOURCE_DIR
  explicit Golden(const std::string& kind) : Golden(golden_dir(), kind) {}
#endif
  const Tensor& at(const std::string& name) const;
  // Entries "<prefix><parameter name>", with the prefix stripped.
  std::vector<std::pair<std::string, Tensor>> with_prefix(const std::string& prefix) const;
};

// The model on the golden batch (inputs moved to `device`), with or without the labels.
template <typename M>
nn::ModelOutput run(M& model, const Golden& g, bool with_labels = true, Device device = Device::cpu()) {
  auto on = [&](const Tensor& x) { return device.is_cpu() ? x : x.to(device); };
  return model.forward(on(g.at("input_ids")), on(g.at("attention_mask")), on(g.at("token_type_ids")),
                       with_labels ? on(g.at("labels")) : Tensor());
}

double max_abs(const Tensor& t);

// Mathematically zero (softmax ignores a shift shared by every key): only rounding noise.
bool is_key_bias(const std::string& name);

// Every parameter's gradient (f32, on `device`) against its golden "grad." entry within tol;
// the golden file must hold one per parameter. The key biases are checked to be rounding
// noise when `key_bias_is_noise`, else skipped (a bf16 run's noise is larger).
void expect_gradients_match(const nn::Module& model, const Golden& g, Device device, double tol,
                            const std::string& label, bool key_bias_is_noise);

template <typename M> struct Kind;
template <> struct Kind<nn::BertForMaskedLM> {
  static constexpr const char* name = "mlm";
  static constexpr const char* architecture = "BertForMaskedLM";
};
template <> struct Kind<nn::BertForSequenceClassification> {
  static constexpr const char* name = "cls";
  static constexpr const char* architecture = "BertForSequenceClassification";
};

// gtest's type-parameter names: "mlm", "cls".
class ModelNames {
 public:
  template <typename T> static std::string GetName(int) { return Kind<T>::name; }
};

}  // namespace ember::testing::bert_golden
