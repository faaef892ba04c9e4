// The pooling layers, Flatten, SiLU, LeakyReLU and Softmax: each forward equals its functional
// op, Flatten's shapes (negative dims, views where the strides allow) and errors, names, no
// parameters, and a small CNN stack built from them trains end to end.
#include <memory>
#include <vector>

#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/layers/pooling.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

TEST(PoolingModules, ForwardEqualsFunctional) {
  Tensor x = random_tensor({2, 3, 9, 8}, DType::f32, true);
  nn::MaxPool2d mp({3}, {2}, {1}, {1}, true);
  EXPECT_TRUE(all_close(mp.forward(x), max_pool2d(x, {3}, {2}, {1}, {1}, true), 0, 0));
  nn::MaxPool2d mp_default({2});
  EXPECT_EQ(mp_default.forward(x).shape(), (Shape{2, 3, 4, 4}));
  nn::AvgPool2d ap({3, 2}, {1, 2}, {1, 0}, false, false);
  EXPECT_TRUE(all_close(ap.forward(x), avg_pool2d(x, {3, 2}, {1, 2}, {1, 0}, false, false), 0, 0));
  nn::AdaptiveAvgPool2d aap({3, 5});
  EXPECT_TRUE(all_close(aap.forward(x), adaptive_avg_pool2d(x, {3, 5}), 0, 0));
  EXPECT_EQ(aap.forward(x).shape(), (Shape{2, 3, 3, 5}));
  nn::SiLU si;
  EXPECT_TRUE(all_close(si.forward(x), silu(x), 0, 0));
  nn::LeakyReLU lr;
  EXPECT_EQ(lr.negative_slope, 0.01);
  EXPECT_TRUE(all_close(lr.forward(x), leaky_relu(x, 0.01), 0, 0));
  nn::LeakyReLU lr2(0.3);
  EXPECT_TRUE(all_close(lr2.forward(x), leaky_relu(x, 0.3), 0, 0));
  EXPECT_FALSE(all_close(lr2.forward(x), lr.forward(x), 0, 0));
  nn::Softmax sm(-1);
  EXPECT_TRUE(all_close(sm.forward(x), softmax(x, -1), 0, 0));
  nn::Softmax sm1(1);
  EXPECT_TRUE(all_close(sm1.forward(x), softmax(x, 1), 0, 0));
}

TEST(PoolingModules, NamesAndNoParameters) {
  std::vector<std::pair<std::shared_ptr<nn::Module>, std::string>> mods = {
      {std::make_shared<nn::MaxPool2d>(Shape{2}), "MaxPool2d"},
      {std::make_shared<nn::AvgPool2d>(Shape{2}), "AvgPool2d"},
      {std::make_shared<nn::AdaptiveAvgPool2d>(Shape{1}), "AdaptiveAvgPool2d"},
      {std::make_shared<nn::Flatten>(), "Flatten"},
      {std::make_shared<nn::SiLU>(), "SiLU"},
      {std::make_shared<nn::LeakyReLU>(), "LeakyReLU"},
      {std::make_shared<nn::Softmax>(1), "Softmax"},
  };
  for (const auto& [m, name] : mods) {
    EXPECT_EQ(m->type_name(), name);
    EXPECT_TRUE(m->parameters().empty()) << name;
  }
}

TEST(PoolingModules, FlattenShapes) {
  Tensor x = random_tensor({2, 3, 4, 5});
  EXPECT_EQ(nn::Flatten().forward(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(nn::Flatten(0).forward(x).shape(), (Shape{120}));
  EXPECT_EQ(nn::Flatten(1, 2).forward(x).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(nn::Flatten(-3, -2).forward(x).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(nn::Flatten(-1).forward(x).shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(nn::Flatten(2, 2).forward(x).shape(), (Shape{2, 3, 4, 5}));
  // a view of contiguous input: same storage, values in row-major order
  Tensor y = nn::Flatten().forward(x);
  EXPECT_EQ(y.raw_data(), x.raw_data());
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
  // a transposed input cannot be viewed flat: a copy with the same logical values
  Tensor xt = x.transpose(2, 3);
  Tensor yt = nn::Flatten().forward(xt);
  EXPECT_EQ(yt.shape(), (Shape{2, 60}));
  EXPECT_EQ(yt.to_vector<float>(), xt.contiguous().to_vector<float>());
}

TEST(PoolingModules, FlattenErrors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_EMBER_ERROR(nn::Flatten(3).forward(x), "flatten", "dim 3", "out of range");
  EXPECT_EMBER_ERROR(nn::Flatten(0, -4).forward(x), "flatten", "dim -4", "out of range");
  EXPECT_EMBER_ERROR(nn::Flatten(2, 1).forward(x), "flatten", "start_dim 2", "end_dim 1");
}

TEST(PoolingModules, SmallCnnHeadBackpropagates) {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::MaxPool2d>(Shape{2}), std::make_shared<nn::SiLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(Shape{2}), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(12, 4), std::make_shared<nn::Softmax>(-1)});
  Tensor x = random_tensor({5, 3, 8, 8}).requires_grad_();
  Tensor y = net->forward(x);
  EXPECT_EQ(y.shape(), (Shape{5, 4}));
  EXPECT_TRUE(all_close(y.sum(Shape{-1}), ones({5}), 1e-5, 1e-5));
  // weight the classes unevenly so the softmax passes a non-zero gradient back
  (y * from_vector<float>({1, 2, 3, 4})).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().shape(), x.shape());
  // max pooling routes to one element of each 2 x 2 window: at least three quarters are zero
  const std::vector<float> g = x.grad().to_vector<float>();
  int64_t zero = 0;
  for (float v : g) zero += v == 0.0f;
  EXPECT_GE(zero * 4, int64_t(g.size()) * 3);
  EXPECT_LT(zero, int64_t(g.size()));
}
