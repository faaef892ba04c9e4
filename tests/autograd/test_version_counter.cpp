// Version counters: every in-place write bumps its storage's counter (shared by views), and a
// backward that reads a tensor saved before an in-place change raises as PyTorch does, while
// the in-place changes PyTorch allows (after backward, on tensors nobody saved) still work.
#include <cmath>
#include <string>

#include "autograd/node.h"
#include "test_util.h"

using namespace ember;

namespace {

constexpr const char* kModified = "one of the variables needed for gradient computation has been modified by an "
                                  "inplace operation: ";

// The part of the message that names the saving op, the shape and both versions.
std::string saved_at(const std::string& op, const std::string& shape, uint64_t saved, uint64_t now) {
  return op + " saved a tensor of shape " + shape + " at version " + std::to_string(saved) +
         ", and it is now at version " + std::to_string(now);
}

Tensor leaf(std::vector<double> values, const Shape& shape) {
  return from_vector<double>(values, shape).requires_grad_();
}

}  // namespace

TEST(VersionCounter, EveryInPlaceOpBumpsItOnce) {
  Tensor x = zeros({4}, {DType::f32});
  const Tensor other = ones({4}, {DType::f32});
  uint64_t v = x.version();
  x.add_(other);
  EXPECT_EQ(x.version(), ++v);
  x.add_(other, 2.0);
  EXPECT_EQ(x.version(), ++v);
  x.mul_(3.0);
  EXPECT_EQ(x.version(), ++v);
  x.fill_(1.0);
  EXPECT_EQ(x.version(), ++v);
  x.zero_();
  EXPECT_EQ(x.version(), ++v);
  x.copy_(other);
  EXPECT_EQ(x.version(), ++v);
  x.copy_(from_vector<double>({1, 2, 3, 4}));  // converting copy
  EXPECT_EQ(x.version(), ++v);
  nn::init::uniform_(x);
  EXPECT_EQ(x.version(), ++v);
  // Reading x, and computing from it, leave it alone; its copies count on their own.
  const std::vector<float> values = x.to_vector<float>();
  const Tensor c = x.clone();
  const Tensor s = x * 2.0;
  EXPECT_EQ(x.version(), v);
  const uint64_t cv = c.version();
  x.fill_(7.0);
  EXPECT_EQ(x.version(), v + 1);
  EXPECT_EQ(c.version(), cv);
  EXPECT_EQ(c.to_vector<float>(), values);
  EXPECT_EQ(s.to_vector<float>()[3], 2 * values[3]);
}

TEST(VersionCounter, ViewsAndDetachedTensorsShareTheCounter) {
  Tensor base = zeros({2, 3}, {DType::f32});
  Tensor row = base.select(0, 1);
  Tensor t = base.t();
  Tensor d = base.detach();
  const uint64_t v = base.version();
  row.fill_(1.0);
  EXPECT_EQ(base.version(), v + 1);
  EXPECT_EQ(t.version(), v + 1);
  EXPECT_EQ(d.version(), v + 1);
  d.narrow(1, 0, 1).mul_(2.0);
  EXPECT_EQ(row.version(), v + 2);
}

TEST(VersionCounter, OptimizerStepsBumpTheParameters) {
  Tensor w = leaf({1, 2, 3}, {3});
  w.set_grad(ones({3}, {DType::f64}));
  optim::SGD sgd({w}, {.lr = 0.1, .momentum = 0.9});
  uint64_t v = w.version();
  sgd.step();
  EXPECT_GT(w.version(), v);
  v = w.version();
  optim::Adam adam({w}, {.lr = 0.1});
  adam.step();
  EXPECT_GT(w.version(), v);
}

TEST(VersionCounter, ModifiedOutputRaisesNamingTheOpShapeAndVersions) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x.exp();
  const uint64_t saved = y.version();
  {
    NoGradGuard no_grad;
    y.mul_(2.0);
  }
  EXPECT_EMBER_ERROR(y.sum().backward(), kModified, saved_at("ExpBackward", "[3]", saved, saved + 1));

  // The same through a detached handle, which shares the storage.
  Tensor y2 = x.exp();
  y2.detach().mul_(2.0);
  EXPECT_EMBER_ERROR(y2.sum().backward(), kModified, saved_at("ExpBackward", "[3]", y2.version() - 1, y2.version()));
  EXPECT_FALSE(x.grad().defined());
}

TEST(VersionCounter, ModifiedWeightBetweenForwardAndBackwardRaises) {
  // h = x w1, loss = sum(h w2): dh needs w2, so stepping w2 before backward must raise.
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w1 = leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2}, {3, 4});
  Tensor w2 = leaf({1, -1, 2, -2}, {4, 1});
  Tensor loss = matmul(matmul(x, w1), w2).sum();
  const uint64_t saved = w2.version();
  w2.set_grad(ones({4, 1}, {DType::f64}));
  optim::SGD opt({w2}, {.lr = 0.1});
  opt.step();  // the optimizer's in-place update, between forward and backward
  EXPECT_EMBER_ERROR(loss.backward(), kModified, saved_at("MatmulBackward", "[4, 1]", saved, saved + 1));
}

TEST(VersionCounter, ModifiedLinearWeightRaises) {
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor w = leaf({1, 0, -1, 2, 1, 0}, {2, 3});
  Tensor out = linear(x, w, Tensor());
  const uint64_t saved = w.version();
  {
    NoGradGuard no_grad;
    w.add_(ones({2, 3}, {DType::f64}));
  }
  EXPECT_EMBER_ERROR(out.sum().backward(), kModified, saved_at("LinearBackward", "[2, 3]", saved, saved + 1));
}

TEST(VersionCounter, ModifyingAViewOfASavedTensorRaises) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x.sigmoid();  // saves its output
  y.detach().narrow(0, 1, 1).fill_(0.0);
  EXPECT_EMBER_ERROR(y.sum().backward(), kModified, "SigmoidBackward saved a tensor of shape [3]");

  // The saved tensor is itself a view; writing into its base is caught too.
  Tensor base = from_vector<double>({1, 2, 3, 4});
  Tensor a = leaf({1, 1}, {2});
  Tensor prod = a * base.narrow(0, 1, 2);  // MulBackward saves the view for da
  const uint64_t saved = base.version();
  base.fill_(5.0);
  EXPECT_EMBER_ERROR(prod.sum().backward(), kModified, saved_at("MulBackward", "[2]", saved, saved + 1));
}

TEST(VersionCounter, RetainedGraphCatchesAChangeBeforeItsSecondBackward) {
  Tensor x = leaf({0.5, 1.5}, {2});
  Tensor y = x.tanh();
  Tensor loss = y.sum();
  loss.backward(Tensor(), /*retain_graph=*/true);
  y.detach().add_(ones({2}, {DType::f64}));
  EXPECT_EMBER_ERROR(loss.backward(), kModified, "TanhBackward saved a tensor of shape [2]");
}

TEST(VersionCounter, OptimizerStepsAfterBackwardAndNoGradUpdatesBetweenIterationsAreAllowed) {
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w1 = leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2}, {3, 4});
  Tensor w2 = leaf({1, -1, 2, -2}, {4, 1});
  optim::Adam opt({w1, w2}, {.lr = 0.01});
  std::vector<double> before = w2.to_vector<double>();
  for (int step = 0; step < 3; ++step) {
    Tensor loss = matmul(matmul(x, w1).relu(), w2).pow(2.0).sum();
    EXPECT_NO_THROW(loss.backward());
    opt.step();
    opt.zero_grad();
    {
      NoGradGuard no_grad;
      w1.mul_(0.99);  // e.g. a manual decay between iterations: the next forward saves anew
    }
  }
  EXPECT_NE(w2.to_vector<double>(), before);
}

TEST(VersionCounter, InPlaceChangesNoBackwardReadsAreAllowed) {
  // Nobody saved y: scaling by a constant and adding a tensor save nothing.
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor c = from_vector<double>({1, 1, 1});
  Tensor y = x * 2.0;
  Tensor z = add(y, c);
  {
    NoGradGuard no_grad;
    y.add_(c);
  }
  c.fill_(3.0);
  EXPECT_NO_THROW(z.sum().backward());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));

  // In x @ w only x needs grad: dx = g w^T reads w but not x, so changing x is allowed
  // (PyTorch saves x only for dw).
  Tensor a = leaf({1, 2, 3, 4}, {2, 2});
  Tensor w = from_vector<double>({1, 0, 0, 1}, {2, 2});
  Tensor out = matmul(a, w);
  {
    NoGradGuard no_grad;
    a.mul_(10.0);
  }
  EXPECT_NO_THROW(out.sum().backward());
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));
}

TEST(VersionCounter, GradientAccumulationWritesNothingSaved) {
  // Accumulating into .grad is an in-place write, but no backward reads .grad.
  Tensor w = leaf({1, 2}, {2});
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(w.exp().sum().backward());
  const std::vector<double> g = w.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 3 * std::exp(1.0), 1e-12);
  EXPECT_NEAR(g[1], 3 * std::exp(2.0), 1e-12);
}

TEST(VersionCounter, SavedTensorKeepsTheVersionItWasSavedAt) {
  Tensor t = from_vector<double>({1, 2});
  t.fill_(3.0);
  const autograd::SavedTensor s = autograd::save(t);
  EXPECT_TRUE(s.unpack().is_same(s.unpack()));
  EXPECT_EQ(s.unpack().to_vector<double>(), (std::vector<double>{3, 3}));
  EXPECT_FALSE(autograd::save(Tensor()).defined());
  EXPECT_FALSE(autograd::save(Tensor()).unpack().defined());
  t.mul_(2.0);
  EXPECT_EMBER_ERROR(s.unpack(), kModified, "a backward formula saved a tensor of shape [2]");
}
