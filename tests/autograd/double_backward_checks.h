// The two checks each list of double-backward cases gets: gradgradcheck of every case in f64,
// and first-order gradients under create_graph equal to an ordinary backward's, bit for bit, in
// f32 and f64 (create_graph changes what is recorded, never the values).
#pragma once
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

}  // namespace ember::testing
