// One gradient check per differentiable op of the manifest (core/native/op_manifest.def): the
// op's public function on small f64 inputs, so test_op_manifest can run gradcheck for every
// manifest entry that has a backward. Inputs of the ops with kinks (relu, abs, clamp, maximum,
// minimum, amax, amin) are fixed values well away from the kinks, so the central differences
// stay on one side. The per-group tests (tests/ops/test_<group>.cpp) check many more shapes.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace ember::testing {

struct GradcheckCase {
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  std::vector<Tensor> inputs;  // f64; those that require grad are checked
};

namespace gradcheck_detail {

inline Tensor leaf(const Tensor& t) { return t.detach().requires_grad_(); }
inline Tensor random_leaf(const Shape& shape, double lo = -2.0, double hi = 2.0) {
  return leaf(random_tensor(shape, DType::f64, false, lo, hi));
}
// Values at least 0.2 apart and 0.2 away from 0 and from +-1.
inline Tensor kink_free_leaf() { return leaf(from_vector<double>({-1.5, -0.6, 0.3, 0.7, 1.6, -2.1}, {2, 3})); }
// Distinct values 0.1 apart in random order: no two tie, so a maximum stays put under the
// central differences.
inline Tensor distinct_leaf(const Shape& shape) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * double(i) - 1.0;
  std::shuffle(v.begin(), v.end(), rng());
  return leaf(from_vector<double>(v, shape));
}

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;
inline GradcheckCase one_input(const Fn1& f, Tensor x) {
  return {[f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; }, {std::move(x)}};
}
inline GradcheckCase two_inputs(const Fn2& f, Tensor a, Tensor b) {
  return {[f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; },
          {std::move(a), std::move(b)}};
}

}  // namespace gradcheck_detail

// op name -> its case; the case builds fresh random inputs each call.
inline std::map<std::string, GradcheckCase> op_gradcheck_cases() {
  using namespace gradcheck_detail;
  using V = std::vector<Tensor>;
  std::map<std::string, GradcheckCase> c;

  // elementwise: b broadcasts along the rows of a
  c["add"] = two_inputs([](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }, random_leaf({2, 3}),
                        random_leaf({3}));
  c["sub"] = two_inputs([](const Tensor& a, const Tensor& b) { return sub(a, b, 2.0); }, random_leaf({2, 3}),
                        random_leaf({3}));
  c["mul"] =
      two_inputs([](const Tensor& a, const Tensor& b) { return mul(a, b); }, random_leaf({2, 3}), random_leaf({3}));
  c["div"] = two_inputs([](const Tensor& a, const Tensor& b) { return div(a, b); }, random_leaf({2, 3}),
                        random_leaf({3}, 0.5, 2.0));
  c["pow"] = {[](const V& in) {
                return V{pow(in[0], in[1]), pow(in[0], 2.5)};
              },
              {random_leaf({2, 3}, 0.5, 2.0), random_leaf({2, 3}, -1.0, 1.0)}};
  const Tensor offsets = from_vector<double>({0.5, -0.4, 0.6, -0.5, 0.4, -0.6}, {2, 3});
  c["maximum"] = two_inputs([](const Tensor& a, const Tensor& b) { return maximum(a, b); }, kink_free_leaf(),
                            leaf(kink_free_leaf() + offsets));
  c["minimum"] = two_inputs([](const Tensor& a, const Tensor& b) { return minimum(a, b); }, kink_free_leaf(),
                            leaf(kink_free_leaf() + offsets));
  c["neg"] = one_input([](const Tensor& x) { return neg(x); }, random_leaf({2, 3}));
  c["exp"] = one_input([](const Tensor& x) { return exp(x); }, random_leaf({2, 3}));
  c["log"] = one_input([](const Tensor& x) { return log(x); }, random_leaf({2, 3}, 0.5, 2.0));
  c["sqrt"] = one_input([](const Tensor& x) { return sqrt(x); }, random_leaf({2, 3}, 0.5, 2.0));
  c["rsqrt"] = one_input([](const Tensor& x) { return rsqrt(x); }, random_leaf({2, 3}, 0.5, 2.0));
  c["tanh"] = one_input([](const Tensor& x) { return tanh(x); }, random_leaf({2, 3}));
  c["sigmoid"] = one_input([](const Tensor& x) { return sigmoid(x); }, random_leaf({2, 3}));
  c["silu"] = one_input([](const Tensor& x) { return silu(x); }, random_leaf({2, 3}));
  c["relu"] = one_input([](const Tensor& x) { return relu(x); }, kink_free_leaf());
  c["leaky_relu"] = one_input([](const Tensor& x) { return leaky_relu(x, 0.2); }, kink_free_leaf());
  c["gelu"] = {[](const V& in) { return V{gelu(in[0]), gelu(in[0], true)}; }, {random_leaf({2, 3})}};
  c["abs"] = one_input([](const Tensor& x) { return abs(x); }, kink_free_leaf());
  c["clamp"] = one_input([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, kink_free_leaf());
  const Tensor cond = gt(from_vector<double>({1, -1, 1, 1, -1, -1}, {2, 3}), 0.0);
  c["where"] = two_inputs([cond](const Tensor& a, const Tensor& b) { return where(cond, a, b); }, random_leaf({2, 3}),
                          random_leaf({3}));
  c["masked_fill"] = one_input([cond](const Tensor& x) { return masked_fill(x, cond, 0.5); }, random_leaf({2, 3}));

  // reduce
  c["sum"] = one_input([](const Tensor& x) { return sum(x, {1}); }, random_leaf({2, 3}));
  c["mean"] = one_input([](const Tensor& x) { return mean(x, {0}, true); }, random_leaf({2, 3}));
  c["amax"] = one_input([](const Tensor& x) { return amax(x, {1}); }, kink_free_leaf());
  c["amin"] = one_input([](const Tensor& x) { return amin(x, {1}); }, kink_free_leaf());
  c["var"] = one_input([](const Tensor& x) { return var(x, {1}); }, random_leaf({2, 3}));

  // linalg
  c["matmul"] = two_inputs([](const Tensor& a, const Tensor& b) { return matmul(a, b); }, random_leaf({2, 3}),
                           random_leaf({3, 4}));
  c["bmm"] = two_inputs([](const Tensor& a, const Tensor& b) { return bmm(a, b); }, random_leaf({2, 2, 3}),
                        random_leaf({2, 3, 2}));
  c["linear"] = {[](const V& in) { return V{linear(in[0], in[1], in[2])}; },
                 {random_leaf({2, 3}), random_leaf({4, 3}), random_leaf({4})}};

  // convolution: strided, padded, grouped, so every index path of the kernels is crossed
  c["conv1d"] = {[](const V& in) { return V{conv1d(in[0], in[1], in[2], 2, 1, 1, 2)}; },
                 {random_leaf({2, 4, 7}), random_leaf({4, 2, 3}), random_leaf({4})}};
  c["conv2d"] = {[](const V& in) { return V{conv2d(in[0], in[1], in[2], {2, 1}, {1, 0}, {1, 2}, 2)}; },
                 {random_leaf({2, 4, 5, 6}), random_leaf({2, 2, 3, 2}), random_leaf({2})}};
  c["conv_transpose2d"] = {
      [](const V& in) { return V{conv_transpose2d(in[0], in[1], in[2], {2, 2}, {1, 0}, {1, 0}, 2)}; },
      {random_leaf({2, 4, 3, 3}), random_leaf({4, 1, 3, 2}), random_leaf({2})}};

  // normalization
  c["softmax"] = one_input([](const Tensor& x) { return softmax(x, 1); }, random_leaf({2, 3}));
  c["log_softmax"] = one_input([](const Tensor& x) { return log_softmax(x, 0); }, random_leaf({2, 3}));
  c["layer_norm"] = {[](const V& in) { return V{layer_norm(in[0], {4}, in[1], in[2])}; },
                     {random_leaf({2, 4}), random_leaf({4}), random_leaf({4})}};
  c["batch_norm"] = {[](const V& in) { return V{batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true)}; },
                     {random_leaf({3, 2, 2}), random_leaf({2}), random_leaf({2})}};
  c["group_norm"] = {[](const V& in) { return V{group_norm(in[0], 2, in[1], in[2])}; },
                     {random_leaf({2, 4, 3}), random_leaf({4}), random_leaf({4})}};
  c["rms_norm"] = {[](const V& in) { return V{rms_norm(in[0], {4}, in[1])}; }, {random_leaf({3, 4}), random_leaf({4})}};

  // nn_functional
  const Tensor indices = from_vector<int64_t>({1, 4, 1, 0});
  c["embedding"] = one_input([indices](const Tensor& w) { return embedding(w, indices); }, random_leaf({5, 3}));
  c["dropout"] = one_input(
      [](const Tensor& x) {
        manual_seed(11);  // the same mask on every evaluation
        return dropout(x, 0.4, true);
      },
      random_leaf({3, 5}));
  const Tensor target = from_vector<int64_t>({1, -100, 4, 0});
  c["cross_entropy"] =
      one_input([target](const Tensor& x) { return cross_entropy(x, target, -100, 0.1); }, random_leaf({4, 5}));
  const Tensor row_targets = from_vector<int64_t>({2, -100, 0});
  c["linear_cross_entropy"] = {
      [row_targets](const V& in) {
        auto [logits, loss] = linear_cross_entropy(in[0], in[1], in[2], row_targets, -100, 0.1);
        return V{loss, logits};  // the loss first: its node is the op's own
      },
      {random_leaf({3, 4}), random_leaf({5, 4}), random_leaf({5})}};

  // pooling: overlapping, padded and ceil-mode windows
  c["max_pool2d"] = {[](const V& in) { return V{max_pool2d(in[0], {3}, {2}, {1}, {1}, true)}; },
                     {distinct_leaf({2, 5, 6})}};
  c["avg_pool2d"] = {[](const V& in) {
                       return V{avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, true, true),
                                avg_pool2d(in[0], {3}, {2}, {1}, false, false)};
                     },
                     {random_leaf({1, 2, 5, 4})}};
  c["adaptive_avg_pool2d"] =
      one_input([](const Tensor& x) { return adaptive_avg_pool2d(x, {3, 2}); }, random_leaf({2, 7, 5}));

  // indexing
  c["cat"] = two_inputs(
      [](const Tensor& a, const Tensor& b) {
        return cat({a, b}, 1);
      },
      random_leaf({2, 3}), random_leaf({2, 2}));
  c["stack"] = two_inputs(
      [](const Tensor& a, const Tensor& b) {
        return stack({a, b}, 1);
      },
      random_leaf({2, 3}), random_leaf({2, 3}));
  c["split"] = {[](const V& in) { return split(in[0], 2, 1); }, {random_leaf({2, 3})}};
  c["chunk"] = {[](const V& in) { return chunk(in[0], 2, 0); }, {random_leaf({3, 2})}};
  const Tensor select = from_vector<int64_t>({2, 0, 2});
  c["index_select"] = one_input([select](const Tensor& x) { return index_select(x, 1, select); }, random_leaf({2, 3}));
  const Tensor gather_index = from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  c["gather"] = one_input([gather_index](const Tensor& x) { return gather(x, 1, gather_index); }, random_leaf({2, 3}));
  c["scatter_add"] =
      two_inputs([gather_index](const Tensor& x, const Tensor& src) { return scatter_add(x, 1, gather_index, src); },
                 random_leaf({2, 3}), random_leaf({2, 2}));

  // fused
  c["bias_gelu"] = two_inputs([](const Tensor& x, const Tensor& b) { return bias_gelu(x, b); }, random_leaf({2, 3}),
                              random_leaf({3}));
  c["add_layer_norm"] = {[](const V& in) { return V{add_layer_norm(in[0], in[1], {4}, in[2], in[3])}; },
                         {random_leaf({2, 4}), random_leaf({2, 4}), random_leaf({4}), random_leaf({4})}};
  const Tensor mask = from_vector<double>({0.0, -1.0, 0.0});
  c["scaled_masked_softmax"] =
      one_input([mask](const Tensor& x) { return scaled_masked_softmax(x, mask, 0.5); }, random_leaf({2, 3}));
  c["packed_self_attention"] =
      one_input([](const Tensor& qkv) { return packed_self_attention(qkv, 2); }, random_leaf({1, 3, 6}));
  c["scaled_dot_product_attention"] = {
      [](const V& in) { return V{scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true)}; },
      {random_leaf({2, 3, 2}), random_leaf({2, 4, 2}), random_leaf({1, 4, 3})}};
  return c;
}

}  // namespace ember::testing
