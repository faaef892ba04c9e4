// Fits y = 3x - 1 with a Linear layer and SGD through an installed Ember, and prints the
// version and the final loss; exits non-zero when the fit fails.
#include <ember/accelerate.h>
#include <ember/ember.h>
#include <ember/version.h>

#include <cstdio>
#include <memory>

int main() {
  using namespace ember;
  manual_seed(0);
  auto layer = std::make_shared<nn::Linear>(1, 1);
  optim::SGD opt(layer->parameters(), {.lr = 0.1});
  const Tensor x = randn({64, 1});
  const Tensor y = x * 3.0 - 1.0;
  double loss_value = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    const Tensor err = layer->forward(x) - y;
    Tensor loss = mean(err * err);
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
  }
#ifdef CONSUMER_EXPECTS_CUDA
  const bool cuda_built = true;
#else
  const bool cuda_built = false;
#endif
  std::printf("ember %s, cuda %s, final loss %.3g\n", EMBER_VERSION, cuda_built ? "built" : "not built", loss_value);
  return loss_value < 1e-4 ? 0 : 1;
}
