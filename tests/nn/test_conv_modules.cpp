// Conv1d, Conv2d and ConvTranspose2d layers: parameter names and shapes, PyTorch's default
// initialisation bounds, state_dict round trip, forward equal to the functional op, and
// option errors.
#include <cmath>

#include "nn/init.h"
#include "nn/layers/conv.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {

std::vector<std::string> parameter_names(const nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
  return names;
}

double max_abs(const Tensor& t) { return amax(abs(t.detach().to(DType::f64)), {}).item<double>(); }

}  // namespace

TEST(ConvModules, ParameterNamesAndShapes) {
  nn::Conv2d c2({.in_channels = 4, .out_channels = 6, .kernel_size = {3, 2}, .groups = 2});
  EXPECT_EQ(parameter_names(c2), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(c2.weight.shape(), (Shape{6, 2, 3, 2}));
  EXPECT_EQ(c2.bias.shape(), (Shape{6}));

  nn::Conv1d c1({.in_channels = 3, .out_channels = 5, .kernel_size = {4}, .bias = false});
  EXPECT_EQ(parameter_names(c1), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(c1.weight.shape(), (Shape{5, 3, 4}));
  EXPECT_FALSE(c1.bias.defined());

  nn::ConvTranspose2d ct({.in_channels = 4, .out_channels = 6, .kernel_size = {3}, .groups = 2});
  EXPECT_EQ(ct.weight.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(ct.bias.shape(), (Shape{6}));
}

TEST(ConvModules, DefaultInitialisationStaysWithinPyTorchsBounds) {
  // kaiming_uniform(a = sqrt(5)) gives bound sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in); the
  // bias is uniform(+-1 / sqrt(fan_in)) too. fan_in = weight dim 1 * kernel area.
  nn::Conv2d c({.in_channels = 8, .out_channels = 16, .kernel_size = {3}});
  const double bound = 1.0 / std::sqrt(8.0 * 9.0);
  EXPECT_LE(max_abs(c.weight), bound);
  EXPECT_GT(max_abs(c.weight), 0.8 * bound);  // 1152 draws reach the edge of the range
  EXPECT_LE(max_abs(c.bias), bound);
  nn::ConvTranspose2d t({.in_channels = 8, .out_channels = 4, .kernel_size = {2}});
  const double t_bound = 1.0 / std::sqrt(4.0 * 4.0);
  EXPECT_LE(max_abs(t.weight), t_bound);
  EXPECT_LE(max_abs(t.bias), t_bound);
}

TEST(ConvModules, StateDictRoundTrip) {
  nn::Conv2d a({.in_channels = 3, .out_channels = 4, .kernel_size = {3}});
  nn::Conv2d b({.in_channels = 3, .out_channels = 4, .kernel_size = {3}});
  const nn::StateDict state = a.state_dict();
  EXPECT_EQ(state.size(), 2u);
  EXPECT_TRUE(state.count("weight") && state.count("bias"));
  b.load_state_dict(state);
  EXPECT_TRUE(all_close(b.weight, a.weight, 0, 0));
  EXPECT_TRUE(all_close(b.bias, a.bias, 0, 0));
  nn::Conv2d wrong({.in_channels = 3, .out_channels = 5, .kernel_size = {3}});
  EXPECT_THROW(wrong.load_state_dict(state), Error);
}

TEST(ConvModules, ForwardEqualsTheFunctionalOp) {
  nn::Conv2d c2({.in_channels = 4,
                 .out_channels = 6,
                 .kernel_size = {3, 2},
                 .stride = {2, 1},
                 .padding = {1, 0},
                 .dilation = {1, 2},
                 .groups = 2});
  const Tensor x2 = random_tensor({2, 4, 7, 6});
  EXPECT_TRUE(all_close(c2.forward(x2), conv2d(x2, c2.weight, c2.bias, {2, 1}, {1, 0}, {1, 2}, 2), 0, 0));

  nn::Conv2d same({.in_channels = 2, .out_channels = 3, .kernel_size = {4}, .padding = "same"});
  const Tensor x3 = random_tensor({2, 5, 5});
  const Tensor y3 = same.forward(x3);
  EXPECT_EQ(y3.shape(), (Shape{3, 5, 5}));
  EXPECT_TRUE(all_close(y3, conv2d(x3, same.weight, same.bias, {1, 1}, "same"), 0, 0));

  nn::Conv1d c1({.in_channels = 3, .out_channels = 2, .kernel_size = {3}, .stride = {2}, .padding = 1});
  const Tensor x1 = random_tensor({4, 3, 9});
  EXPECT_TRUE(all_close(c1.forward(x1), conv1d(x1, c1.weight, c1.bias, 2, 1), 0, 0));
  nn::Conv1d valid({.in_channels = 3, .out_channels = 2, .kernel_size = {3}, .padding = "valid"});
  EXPECT_EQ(valid.forward(x1).shape(), (Shape{4, 2, 7}));

  nn::ConvTranspose2d ct(
      {.in_channels = 4, .out_channels = 2, .kernel_size = {3}, .stride = {2}, .padding = 1, .output_padding = {1}});
  const Tensor xt = random_tensor({2, 4, 5, 5});
  const Tensor yt = ct.forward(xt);
  EXPECT_EQ(yt.shape(), (Shape{2, 2, 10, 10}));
  EXPECT_TRUE(all_close(yt, conv_transpose2d(xt, ct.weight, ct.bias, {2, 2}, {1, 1}, {1, 1}), 0, 0));
}

TEST(ConvModules, GradientsReachTheParameters) {
  nn::Conv2d c({.in_channels = 2, .out_channels = 3, .kernel_size = {3}, .padding = 1});
  c.forward(random_tensor({2, 2, 5, 5})).sum().backward();
  EXPECT_EQ(c.weight.grad().shape(), c.weight.shape());
  EXPECT_GT(max_abs(c.weight.grad()), 0.0);
  // d(sum y)/d(bias[o]) is the number of output positions: 2 images * 25.
  EXPECT_TRUE(all_close(c.bias.grad(), full({3}, 50.0), 0, 1e-4));
}

TEST(ConvModules, OptionErrors) {
  EXPECT_EMBER_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = {3}, .groups = 2}), "Conv2d",
                     "in_channels=3", "divisible by groups=2");
  EXPECT_EMBER_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = {3, 3, 3}}), "Conv2d",
                     "expected 1 or 2 values");
  EXPECT_EMBER_ERROR(nn::Conv1d({.in_channels = 3, .out_channels = 4, .kernel_size = {0}}), "Conv1d",
                     "kernel_size must be positive");
  EXPECT_EMBER_ERROR(nn::ConvTranspose2d({.in_channels = 3, .out_channels = 4, .kernel_size = {3}, .padding = "same"}),
                     "ConvTranspose2d", "padding must be numbers");
  nn::Conv2d c({.in_channels = 3, .out_channels = 4, .kernel_size = {3}});
  EXPECT_EMBER_ERROR(c.forward(zeros({1, 2, 5, 5})), "conv2d", "[1, 2, 5, 5]");
}
