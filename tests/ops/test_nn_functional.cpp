// embedding, dropout and cross_entropy: forward and backward against the reference on random
// shapes and dtypes, determinism across thread counts, gradcheck, and error messages.
#include <cmath>
#include <limits>

#include "kernels/reference/nn_functional.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_gradcheck;
using ember::testing::kFloatTypes;
using ember::testing::random_index;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::rng;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::with_one_and_two_threads;
namespace ref = ember::reference;

namespace {

const std::vector<Reduction> kReductions = {Reduction::None, Reduction::Mean, Reduction::Sum};

// Class targets in [0, classes), about a quarter replaced by ignore_index.
Tensor random_target(const Shape& shape, int64_t classes, int64_t ignore_index) {
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (auto& x : v) x = uniform_int(0, 3) == 0 ? ignore_index : uniform_int(0, classes - 1);
  return from_vector(v, {int64_t(v.size())}).reshape(shape);
}

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}

}  // namespace

// ---------------------------------------------------------------- embedding

TEST(Embedding, ForwardMatchesReference) {
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t num = uniform_int(1, 9), dim = uniform_int(0, 6);
    const DType dtype = kFloatTypes[size_t(uniform_int(0, 3))];
    Tensor weight = random_tensor({num, dim}, dtype, coin());
    const Shape ishape = random_shape(int(uniform_int(0, 3)), 4, true);
    Tensor indices = random_index(ishape, num, coin() ? DType::i32 : DType::i64);
    SCOPED_TRACE(::testing::Message() << "weight [" << num << ", " << dim << "] indices " << shape_str(ishape));
    Tensor out = embedding(weight, indices);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_TRUE(all_close(out, ref::embedding(ref::from_tensor(weight), ref::from_tensor(indices)), 0, 0));
  }
}

TEST(Embedding, BackwardMatchesReferenceWithPadding) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t num = uniform_int(2, 8), dim = uniform_int(1, 5);
      Tensor weight = random_tensor({num, dim}, dtype).requires_grad_();
      Tensor indices = random_index({3, uniform_int(1, 6)}, num, coin() ? DType::i32 : DType::i64);
      const int64_t pad = uniform_int(0, num - 1);
      Tensor out = embedding(weight, indices, coin() ? pad : pad - num);  // negative padding_idx counts from the end
      Tensor g = random_tensor(out.shape(), dtype);
      out.backward(g);
      const auto expected = ref::embedding_backward(ref::from_tensor(g), ref::from_tensor(indices), num, pad);
      const double tol = tolerance(dtype);
      EXPECT_TRUE(all_close(weight.grad(), expected, tol, tol)) << dtype_name(dtype);
      for (int64_t k = 0; k < dim; ++k) EXPECT_EQ(weight.grad().select(0, pad).to_vector<double>()[size_t(k)], 0.0);
    }
  }
}

TEST(Embedding, BackwardIsDeterministicAcrossThreadCounts) {
  // Thousands of positions reading five rows: the per-row sum order must not depend on threads.
  Tensor weight = random_tensor({5, 64}).requires_grad_();
  Tensor indices = random_index({40, 125}, 5);
  Tensor g = random_tensor({40, 125, 64});
  auto grad_of = [&] {
    weight.set_grad(Tensor());
    embedding(weight, indices).backward(g);
    return weight.grad();
  };
  auto [one, two] = with_one_and_two_threads(grad_of);
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
  EXPECT_TRUE(all_close(one, ref::embedding_backward(ref::from_tensor(g), ref::from_tensor(indices), 5, -1), 1e-5, 1e-4));
}

TEST(Embedding, Gradcheck) {
  Tensor weight = random_tensor({5, 3}, DType::f64).requires_grad_();
  Tensor indices = from_vector<int64_t>({0, 2, 2, 4, 1, 0}, {2, 3});
  expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {embedding(in[0], indices)}; },
                   {weight});
  // (padding_idx deliberately breaks the finite-difference match for its row; the reference
  // test above checks that row stays zero)
  Tensor no_pad_rows = from_vector<int64_t>({0, 1, 4, 4}, {4});
  expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {embedding(in[0], no_pad_rows, 2)};
  }, {weight});
}

TEST(Embedding, Errors) {
  Tensor weight = zeros({10, 3});
  EXPECT_EMBER_ERROR(embedding(weight, from_vector<int64_t>({1, 10})), "embedding", "index 10", "[0, 10)");
  EXPECT_EMBER_ERROR(embedding(weight, from_vector<int32_t>({-1}, {1})), "embedding", "index -1", "[0, 10)");
  EXPECT_EMBER_ERROR(embedding(weight, from_vector<float>({1}, {1})), "embedding", "float32", "[1]");
  EXPECT_EMBER_ERROR(embedding(zeros({10}), from_vector<int64_t>({1}, {1})), "embedding", "2-D", "[10]");
  EXPECT_EMBER_ERROR(embedding(weight, from_vector<int64_t>({1}), 12), "embedding", "padding_idx", "12");
}

// ---------------------------------------------------------------- dropout

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  Tensor x = random_tensor({3, 4});
  EXPECT_TRUE(dropout(x, 0.5, false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).is_same(x));
  const GeneratorState before = default_generator().get_state();
  Tensor dropped = dropout(x, 1.0, true);
  EXPECT_EQ(dropped.to_vector<float>(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(default_generator().get_state().offset, before.offset);  // p = 1 draws nothing
  Tensor xg = random_tensor({3, 4}).requires_grad_();
  dropout(xg, 1.0, true).backward(ones({3, 4}));
  EXPECT_EQ(xg.grad().to_vector<float>(), std::vector<float>(12, 0.0f));
}

TEST(Dropout, KeepsAboutOneMinusPAndScales) {
  for (double p : {0.1, 0.3, 0.75}) {
    manual_seed(2024);
    Tensor y = dropout(ones({100000}), p, true);
    const auto v = y.to_vector<float>();
    int64_t kept = 0;
    for (float e : v) {
      if (e != 0.0f) {
        ++kept;
        ASSERT_EQ(e, float(1.0 / (1.0 - p)));
      }
    }
    // binomial standard deviation is below 0.0015 here; 0.01 is over six of them
    EXPECT_NEAR(double(kept) / 1e5, 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(Dropout, SameSeedSameMaskWhateverTheThreadCount) {
  Tensor x = random_tensor({300, 200});
  auto [one, two] = with_one_and_two_threads([&] {
    manual_seed(77);
    return dropout(x, 0.4, true);
  });
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
  EXPECT_TRUE(all_close(one, ref::dropout(ref::from_tensor(x), 0.4, {77, 0}), 1e-6, 1e-6));
  EXPECT_EQ(default_generator().get_state().offset, 60000u);  // one counter per element
  EXPECT_NE(dropout(x, 0.4, true).to_vector<float>(), one.to_vector<float>());  // next call: fresh mask
}

TEST(Dropout, ForwardAndBackwardMatchReference) {
  for (DType dtype : kFloatTypes) {
    for (int trial = 0; trial < 3; ++trial) {
      const Shape shape = random_shape(int(uniform_int(1, 3)), 6, true);
      const double p = std::uniform_real_distribution<double>(0.05, 0.95)(rng());
      Tensor x = random_tensor(shape, dtype, coin()).requires_grad_();
      const GeneratorState state = default_generator().get_state();
      Tensor y = dropout(x, p, true);
      const double tol = tolerance(dtype);
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(shape) << " p " << p);
      EXPECT_TRUE(all_close(y, ref::dropout(ref::from_tensor(x), p, state), tol, tol));
      Tensor g = random_tensor(shape, dtype);
      y.backward(g);
      // gradient = g * mask / (1 - p), the same mask as the forward
      ref::RefTensor expected = ref::dropout_mask(shape, p, state);
      const ref::RefTensor gr = ref::from_tensor(g);
      for (int64_t i = 0; i < expected.numel(); ++i) expected.data[size_t(i)] *= gr.data[size_t(i)] / (1 - p);
      EXPECT_TRUE(all_close(x.grad(), expected, tol, tol));
    }
  }
}

TEST(Dropout, Gradcheck) {
  Tensor x = random_tensor({3, 5}, DType::f64).requires_grad_();
  expect_gradcheck([](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    manual_seed(11);  // the same mask on every evaluation
    return {dropout(in[0], 0.4, true)};
  }, {x});
}

TEST(Dropout, Errors) {
  Tensor x = zeros({2, 2});
  EXPECT_EMBER_ERROR(dropout(x, 1.5, true), "dropout", "1.5", "[0, 1]");
  EXPECT_EMBER_ERROR(dropout(x, -0.1, false), "dropout", "-0.1");
  EXPECT_EMBER_ERROR(dropout(zeros({2}, {DType::i64}), 0.5, true), "dropout", "int64");
}

// ---------------------------------------------------------------- cross_entropy

TEST(CrossEntropy, MatchesReferenceForAllLayoutsAndOptions) {
  for (DType dtype : kFloatTypes) {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t n = uniform_int(1, 5), c = uniform_int(1, 7);
      Shape lshape{n, c}, tshape{n};
      const int extra = int(uniform_int(0, 2));
      for (int k = 0; k < extra; ++k) {
        const int64_t d = uniform_int(1, 3);
        lshape.push_back(d);
        tshape.push_back(d);
      }
      if (trial == 0) {  // unbatched
        lshape = {c};
        tshape = {};
      }
      const int64_t ignore_index = coin() ? -100 : uniform_int(0, c - 1);
      Tensor logits = random_tensor(lshape, dtype, coin(), -4, 4);
      Tensor target = random_target(tshape, c, ignore_index);
      for (double smoothing : {0.0, 0.1}) {
        for (Reduction red : kReductions) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " logits " << shape_str(lshape) << " ignore "
                                            << ignore_index << " smoothing " << smoothing << " " << reduction_name(red));
          Tensor x = logits.detach().requires_grad_();
          Tensor loss = cross_entropy(x, target, ignore_index, smoothing, red);
          const auto expected = ref::cross_entropy(ref::from_tensor(logits), ref::from_tensor(target), ignore_index,
                                                   smoothing, red);
          const double tol = tolerance(dtype);
          EXPECT_EQ(loss.dtype(), dtype);
          EXPECT_TRUE(all_close(loss, expected, tol, tol));
          if (std::isnan(loss.to_vector<double>()[0]) && red == Reduction::Mean) continue;  // nothing to backprop
          Tensor g = red == Reduction::None ? random_tensor(tshape, dtype).reshape(tshape) : scalar_tensor(1.5, {dtype});
          loss.backward(g);
          const auto expected_grad = ref::cross_entropy_backward(ref::from_tensor(logits), ref::from_tensor(target),
                                                                 ref::from_tensor(g), ignore_index, smoothing, red);
          EXPECT_TRUE(all_close(x.grad(), expected_grad, tol, 2 * tol));
        }
      }
    }
  }
}

TEST(CrossEntropy, BertVocabularyRowsMatchReference) {
  // The masked-LM shape: 30522 classes, most rows ignored.
  const int64_t c = 30522;
  Tensor logits = random_tensor({4, c}, DType::f32, false, -8, 8);
  Tensor target = from_vector<int64_t>({17, -100, 30521, -100});
  for (double smoothing : {0.0, 0.1}) {
    Tensor x = logits.detach().requires_grad_();
    Tensor loss = cross_entropy(x, target, -100, smoothing);
    EXPECT_TRUE(all_close(loss, ref::cross_entropy(ref::from_tensor(logits), ref::from_tensor(target), -100, smoothing,
                                                   Reduction::Mean), 1e-5, 1e-5));
    loss.backward();
    const auto expected = ref::cross_entropy_backward(ref::from_tensor(logits), ref::from_tensor(target),
                                                      ref::RefTensor(Shape{}, 1.0), -100, smoothing, Reduction::Mean);
    EXPECT_TRUE(all_close(x.grad(), expected, 1e-4, 1e-8));
  }
}

TEST(CrossEntropy, MaskedLogitsAndIgnoredRows) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor logits = from_vector<float>({-inf, 1.0f, 2.0f, 0.5f, -1e30f, 3.0f}, {2, 3}).requires_grad_();
  Tensor target = from_vector<int64_t>({2, 2});
  Tensor loss = cross_entropy(logits, target, -100, 0.0, Reduction::Sum);
  const double expected = std::log(std::exp(1.0) + std::exp(2.0)) - 2.0 + std::log(std::exp(0.5) + std::exp(3.0)) - 3.0;
  EXPECT_NEAR(loss.item<double>(), expected, 1e-6);
  loss.backward();
  const auto g = logits.grad().to_vector<float>();
  EXPECT_EQ(g[0], 0.0f);  // masked logits get exactly no gradient
  EXPECT_EQ(g[4], 0.0f);
  EXPECT_NEAR(g[2], 1.0 / (1.0 + std::exp(-1.0)) - 1.0, 1e-6);
  // every row ignored: mean is 0/0 = nan (as PyTorch), sum is 0, and nothing flows back
  Tensor x = logits.detach().requires_grad_();
  Tensor all_ignored = full({2}, -100, {DType::i64});
  EXPECT_TRUE(std::isnan(cross_entropy(x.detach(), all_ignored).item<double>()));
  cross_entropy(x, all_ignored, -100, 0.1, Reduction::Sum).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(6, 0.0f));
  // NaN logits give a NaN loss rather than a silent number
  Tensor bad = from_vector<float>({NAN, 1.0f, 2.0f}, {1, 3});
  EXPECT_TRUE(std::isnan(cross_entropy(bad, from_vector<int64_t>({1}, {1})).item<double>()));
}

TEST(CrossEntropy, SameResultWhateverTheThreadCount) {
  Tensor logits = random_tensor({512, 300});
  Tensor target = random_target({512}, 300, -100);
  auto [one, two] = with_one_and_two_threads([&] { return cross_entropy(logits, target, -100, 0.1); });
  EXPECT_EQ(one.item<float>(), two.item<float>());
}

TEST(CrossEntropy, Gradcheck) {
  Tensor logits = random_tensor({4, 5}, DType::f64).requires_grad_();
  Tensor target = from_vector<int64_t>({1, -100, 4, 0});
  for (double smoothing : {0.0, 0.1}) {
    for (Reduction red : kReductions) {
      expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        return {cross_entropy(in[0], target, -100, smoothing, red)};
      }, {logits});
    }
  }
  Tensor spatial = random_tensor({2, 3, 2}, DType::f64).requires_grad_();
  Tensor spatial_target = from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    return {cross_entropy(in[0], spatial_target, 1, 0.1, Reduction::Mean)};
  }, {spatial});
}

TEST(CrossEntropy, Errors) {
  Tensor logits = zeros({3, 5});
  EXPECT_EMBER_ERROR(cross_entropy(logits, zeros({4}, {DType::i64})), "cross_entropy", "[4]", "[3, 5]", "[3]");
  EXPECT_EMBER_ERROR(cross_entropy(zeros({3, 5, 2}), zeros({3}, {DType::i64})), "cross_entropy", "[3]", "[3, 5, 2]",
                     "[3, 2]");
  EXPECT_EMBER_ERROR(cross_entropy(logits, from_vector<int64_t>({0, 7, 1})), "cross_entropy", "target 7", "[0, 5)");
  EXPECT_EMBER_ERROR(cross_entropy(logits, from_vector<int64_t>({0, -1, 1})), "cross_entropy", "target -1", "[0, 5)");
  EXPECT_EMBER_ERROR(cross_entropy(logits, zeros({3})), "cross_entropy", "float32", "[3]");
  EXPECT_EMBER_ERROR(cross_entropy(zeros({3, 5}, {DType::i64}), zeros({3}, {DType::i64})), "cross_entropy", "int64");
  EXPECT_EMBER_ERROR(cross_entropy(logits, zeros({3}, {DType::i64}), -100, 1.5), "cross_entropy", "label_smoothing",
                     "1.5");
  EXPECT_EMBER_ERROR(cross_entropy(scalar_tensor(1.0), zeros({}, {DType::i64})), "cross_entropy", "[]");
}
