// The two checks each list of double-backward cases gets: gradgradcheck of every case in f64,
// and first-order gradients under create_graph equal to an ordinary backward's, bit for bit, in
// f32 and f64 (create_graph changes what is recorded, never the values). For a fused op, a third:
// its Hessian-vector products equal those of the composition it stands for.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "double_backward_op_cases.h"
#include "same_bits.h"
#include "test_util.h"

namespace ember::testing {

inline void expect_gradgradcheck_passes(const std::vector<DoubleBackwardCase>& cases) {
  for (const DoubleBackwardCase& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      const GradcheckResult r = gradgradcheck(
          [&c](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.fn(in)}; }, case_inputs(c, DType::f64));
      EXPECT_TRUE(r.ok) << r.message;
    } catch (const Error& err) {  // an op whose gradient is not differentiable names itself here
      ADD_FAILURE() << err.what();
    }
  }
}

inline void expect_first_order_bits_match(const std::vector<DoubleBackwardCase>& cases) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const DoubleBackwardCase& c : cases) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      const std::vector<Tensor> in = case_inputs(c, dtype);
      const Tensor seed = random_tensor(c.fn(in).shape(), dtype);
      const std::vector<Tensor> with_graph = autograd::grad({c.fn(in)}, in, {seed}, /*create_graph=*/true);
      c.fn(in).backward(seed);
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_TRUE(with_graph[i].defined()) << i;
        EXPECT_FALSE(in[i].grad().requires_grad()) << i;
        EXPECT_TRUE(same_bits(with_graph[i], in[i].grad())) << i;
      }
    }
  }
}

// A fused op's case and the composition of differentiable ops it stands for.
struct FusedCase {
  DoubleBackwardCase fused;
  std::function<Tensor(const std::vector<Tensor>&)> composed;
};

// The fused ops' own cases, for the checks every list of cases gets.
inline std::vector<DoubleBackwardCase> fused_ops_of(const std::vector<FusedCase>& cases) {
  std::vector<DoubleBackwardCase> out;
  for (const FusedCase& c : cases) out.push_back(c.fused);
  return out;
}

// The Hessian-vector product of sum(fn(in) * seed) in the inputs, along v.
inline std::vector<Tensor> hessian_vector_product(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                                  const std::vector<Tensor>& in, const Tensor& seed,
                                                  const std::vector<Tensor>& v) {
  const std::vector<Tensor> g = autograd::grad({fn(in)}, in, {seed}, /*create_graph=*/true);
  Tensor dot = sum(mul(g[0], v[0]));
  for (size_t i = 1; i < in.size(); ++i) dot = add(dot, sum(mul(g[i], v[i])));
  return autograd::grad({dot}, in);
}

// The second derivatives are those of the composition, to 1e-9 in f64.
inline void expect_hessian_vector_products_match(const std::vector<FusedCase>& cases) {
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(c.fused.name);
    const std::vector<Tensor> in = case_inputs(c.fused, DType::f64);
    std::vector<Tensor> v;
    for (const Tensor& t : in) v.push_back(random_tensor(t.shape(), DType::f64));
    const Tensor seed = random_tensor(c.fused.fn(in).shape(), DType::f64);
    const std::vector<Tensor> fused = hessian_vector_product(c.fused.fn, in, seed, v);
    const std::vector<Tensor> composed = hessian_vector_product(c.composed, in, seed, v);
    for (size_t i = 0; i < in.size(); ++i) {
      // undefined in both where the gradient does not depend on that input (layer norm's bias)
      ASSERT_EQ(fused[i].defined(), composed[i].defined()) << i;
      if (!fused[i].defined()) continue;
      const std::vector<double> a = fused[i].to_vector<double>(), b = composed[i].to_vector<double>();
      ASSERT_EQ(a.size(), b.size()) << i;
      double largest = 0.0;
      for (double e : b) largest = std::max(largest, std::abs(e));
      EXPECT_GT(largest, 0.0) << i;  // a zero product would match a formula missing its terms
      for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-9 * (1.0 + std::abs(b[j]))) << i << " " << j;
    }
  }
}

}  // namespace ember::testing
