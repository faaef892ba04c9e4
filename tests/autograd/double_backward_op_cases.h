// The ops whose backward is differentiable (double backward under create_graph), one case
// each: small inputs, broadcasting for the binary ops, and for the linear ops (views,
// reductions) a square around them so their gradient depends on the input too. Inputs are made
// in any dtype, so the same cases check second derivatives in f64 and first-order bits in f32.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "test_util.h"

namespace ember::testing {

// Where an input's values lie: positive for log, sqrt, rsqrt, fractional powers and divisors.
enum class Domain { any, positive };

struct InputSpec {
  Shape shape;
  Domain domain = Domain::any;
};

struct DoubleBackwardCase {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

// v(x) * v(x): a view or linear op v inside a product, so the second derivative reaches v's
// backward from both the seed and the input.
inline std::function<Tensor(const std::vector<Tensor>&)> squared(std::function<Tensor(const Tensor&)> v) {
  return [v](const std::vector<Tensor>& in) { return mul(v(in[0]), v(in[0])); };
}

inline std::vector<DoubleBackwardCase> double_backward_cases() {
  using In = std::vector<Tensor>;
  const Domain pos = Domain::positive;
  return {
      // ---- binary, broadcasting
      {"add alpha broadcast", {{{2, 3}}, {{3}}}, [](const In& in) { return mul(add(in[0], in[1], 1.5), in[0]); }},
      {"sub alpha broadcast", {{{2, 1, 3}}, {{4, 1}}}, [](const In& in) { return tanh(sub(in[0], in[1], 0.5)); }},
      {"mul broadcast", {{{2, 3}}, {{2, 1}}}, [](const In& in) { return mul(in[0], in[1]); }},
      {"mul by itself", {{{4}}}, [](const In& in) { return mul(in[0], in[0]); }},
      {"div broadcast", {{{3, 2}}, {{2}, pos}}, [](const In& in) { return div(in[0], in[1]); }},
      {"pow tensor broadcast", {{{2, 3}, pos}, {{3}}}, [](const In& in) { return pow(in[0], in[1]); }},
      {"maximum broadcast", {{{2, 3}}, {{3}}}, [](const In& in) { return mul(maximum(in[0], in[1]), in[0]); }},
      {"minimum broadcast", {{{2, 3}}, {{3}}}, [](const In& in) { return mul(minimum(in[0], in[1]), in[1]); }},
      {"where broadcast", {{{2, 3}}, {{3}}},
       [](const In& in) { return mul(where(gt(in[0], 0.0), in[0], in[1]), in[1]); }},
      {"masked_fill", {{{2, 3}}}, [](const In& in) { return mul(masked_fill(in[0], lt(in[0], 0.5), 2.0), in[0]); }},
      // ---- scalar variants
      {"add scalar", {{{5}}}, [](const In& in) { return mul(add(in[0], 2.0), in[0]); }},
      {"sub scalar", {{{5}}}, [](const In& in) { return mul(sub(in[0], 1.5), in[0]); }},
      {"mul scalar", {{{5}}}, [](const In& in) { return mul(mul(in[0], -3.0), in[0]); }},
      {"div scalar", {{{5}}}, [](const In& in) { return mul(div(in[0], 4.0), in[0]); }},
      {"neg", {{{5}}}, [](const In& in) { return mul(neg(in[0]), in[0]); }},
      // ---- unary
      {"pow 2 (square)", {{{5}}}, [](const In& in) { return pow(in[0], 2.0); }},
      {"pow 3", {{{5}}}, [](const In& in) { return pow(in[0], 3.0); }},
      {"pow 0.5", {{{5}, pos}}, [](const In& in) { return pow(in[0], 0.5); }},
      {"pow -1.5", {{{5}, pos}}, [](const In& in) { return pow(in[0], -1.5); }},
      {"pow 1", {{{5}}}, [](const In& in) { return mul(pow(in[0], 1.0), in[0]); }},
      {"exp", {{{2, 3}}}, [](const In& in) { return exp(in[0]); }},
      {"log", {{{2, 3}, pos}}, [](const In& in) { return log(in[0]); }},
      {"sqrt", {{{2, 3}, pos}}, [](const In& in) { return sqrt(in[0]); }},
      {"rsqrt", {{{2, 3}, pos}}, [](const In& in) { return rsqrt(in[0]); }},
      {"tanh", {{{2, 3}}}, [](const In& in) { return tanh(in[0]); }},
      {"sigmoid", {{{2, 3}}}, [](const In& in) { return sigmoid(in[0]); }},
      {"relu", {{{2, 3}}}, [](const In& in) { return mul(relu(in[0]), in[0]); }},
      {"leaky_relu", {{{2, 3}}}, [](const In& in) { return mul(leaky_relu(in[0], 0.2), in[0]); }},
      {"gelu", {{{2, 3}}}, [](const In& in) { return gelu(in[0]); }},
      {"gelu tanh form", {{{2, 3}}}, [](const In& in) { return gelu(in[0], /*tanh_approx=*/true); }},
      {"silu", {{{2, 3}}}, [](const In& in) { return silu(in[0]); }},
      {"abs", {{{2, 3}}}, [](const In& in) { return mul(abs(in[0]), in[0]); }},
      {"clamp", {{{2, 3}}}, [](const In& in) { return mul(clamp(in[0], -1.0, 1.0), in[0]); }},
      {"clamp min only", {{{2, 3}}}, [](const In& in) { return mul(clamp(in[0], 0.0, std::nullopt), in[0]); }},
      // ---- reductions
      {"sum all", {{{2, 3}}}, squared([](const Tensor& x) { return sum(x); })},
      {"sum dim", {{{2, 3, 2}}}, squared([](const Tensor& x) { return sum(x, {1}); })},
      {"sum dims keepdim", {{{2, 3, 2}}}, squared([](const Tensor& x) { return sum(x, {0, 2}, true); })},
      {"mean all", {{{2, 3}}}, squared([](const Tensor& x) { return mean(x); })},
      {"mean last dim", {{{2, 3}}}, squared([](const Tensor& x) { return mean(x, {-1}); })},
      {"mean dim keepdim", {{{2, 3}}}, squared([](const Tensor& x) { return mean(x, {0}, true); })},
      {"var dim", {{{2, 4}}}, [](const In& in) { return var(in[0], {1}); }},
      {"amax dim", {{{2, 4}}}, squared([](const Tensor& x) { return amax(x, {1}); })},
      {"amin all", {{{2, 4}}}, squared([](const Tensor& x) { return amin(x); })},
      // ---- views and shape ops
      {"view", {{{2, 6}}}, squared([](const Tensor& x) { return x.view({3, 4}); })},
      {"reshape", {{{2, 6}}}, squared([](const Tensor& x) { return x.transpose(0, 1).reshape({4, 3}); })},
      {"flatten", {{{2, 3, 2}}}, squared([](const Tensor& x) { return x.flatten(1); })},
      {"transpose", {{{2, 3}}}, [](const In& in) { return mul(in[0].t(), tanh(in[0].t())); }},
      {"permute", {{{2, 3, 2}}}, squared([](const Tensor& x) { return x.permute({2, 0, 1}); })},
      {"slice step 2", {{{3, 5}}}, squared([](const Tensor& x) { return x.slice(1, 1, 5, 2); })},
      {"narrow", {{{4, 3}}}, squared([](const Tensor& x) { return x.narrow(0, 1, 2); })},
      {"select", {{{3, 4}}}, squared([](const Tensor& x) { return x.select(1, 2); })},
      {"expand", {{{3, 1}}}, squared([](const Tensor& x) { return x.expand({2, 3, 4}); })},
      {"squeeze", {{{3, 1, 2}}}, squared([](const Tensor& x) { return x.squeeze(); })},
      {"squeeze dim", {{{3, 1, 2}}}, squared([](const Tensor& x) { return x.squeeze(1); })},
      {"unsqueeze", {{{3, 2}}}, squared([](const Tensor& x) { return x.unsqueeze(1); })},
      {"clone", {{{3, 2}}}, squared([](const Tensor& x) { return x.clone(); })},
      {"cat", {{{2, 3}}, {{2, 1}}}, [](const In& in) { return tanh(cat({in[0], in[1], in[0]}, 1)); }},
      {"stack", {{{2, 3}}, {{2, 3}}}, [](const In& in) { return tanh(stack({in[0], in[1]}, 1)); }},
      // ---- products
      {"matmul 2d", {{{3, 4}}, {{4, 2}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"matmul batch by matrix", {{{2, 3, 4}}, {{4, 2}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"matmul broadcast batches", {{{1, 3, 4}}, {{2, 4, 2}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"matmul vector matrix", {{{4}}, {{4, 3}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"matmul matrix vector", {{{3, 4}}, {{4}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"matmul dot", {{{4}}, {{4}}}, [](const In& in) { return matmul(in[0], in[1]); }},
      {"bmm", {{{2, 3, 4}}, {{2, 4, 2}}}, [](const In& in) { return bmm(in[0], in[1]); }},
      {"linear", {{{3, 4}}, {{2, 4}}, {{2}}}, [](const In& in) { return linear(in[0], in[1], in[2]); }},
      {"linear 3d input", {{{2, 3, 4}}, {{5, 4}}, {{5}}}, [](const In& in) { return linear(in[0], in[1], in[2]); }},
      {"linear no bias", {{{3, 4}}, {{2, 4}}}, [](const In& in) { return tanh(linear(in[0], in[1])); }},
  };
}

// Random inputs of one case in `dtype`, requiring grad: values in [-2, 2), or [0.5, 2) for
// Domain::positive.
inline std::vector<Tensor> case_inputs(const DoubleBackwardCase& c, DType dtype) {
  std::vector<Tensor> in;
  for (const InputSpec& s : c.inputs) {
    const bool positive = s.domain == Domain::positive;
    in.push_back(random_tensor(s.shape, dtype, false, positive ? 0.5 : -2.0, 2.0).requires_grad_());
  }
  return in;
}

}  // namespace ember::testing
