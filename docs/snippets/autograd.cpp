// The first program of docs/quickstart.md: a tensor, an op, backward, and the gradient it gives.
// y = sum(x * x) has dy/dx = 2x, so the program prints 2, 4, 6 (the docs test checks it).
// [first-tensor]
#include <ember/ember.h>

#include <iostream>

int main() {
  ember::Tensor x = ember::from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  ember::Tensor y = (x * x).sum();  // a 0-dim tensor
  y.backward();                     // fills x.grad() with dy/dx = 2x
  std::cout << "y = " << y.item<float>() << "\n";
  for (float g : x.grad().to_vector<float>()) std::cout << "dy/dx " << g << "\n";

  // The README's example: a random product, relu, sum; w.grad() holds dloss/dw.
  ember::manual_seed(0);
  auto a = ember::randn({32, 64});
  auto w = ember::randn({64, 10}).requires_grad_();
  auto loss = ember::matmul(a, w).relu().sum();
  loss.backward();
  std::cout << "dloss/dw is " << w.grad().size(0) << " x " << w.grad().size(1) << "\n";
}
// [/first-tensor]
