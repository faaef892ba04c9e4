#include "nn/losses.h"

#include "nn/functional.h"

namespace ember::nn {

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  auto scope = enter_forward();
  return scope.exit(functional::mse_loss(input, target, reduction));
}

}  // namespace ember::nn
