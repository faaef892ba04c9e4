// Loss modules.
#pragma once
#include "nn/module.h"

namespace ember::nn {

struct CrossEntropyLossOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions opt = {}) : Module("CrossEntropyLoss"), opt(opt) {}
  Tensor forward(const Tensor& logits, const Tensor& target) {
    auto scope = enter_forward();
    return scope.exit(cross_entropy(logits, target, opt.ignore_index, opt.label_smoothing, opt.reduction));
  }
  CrossEntropyLossOptions opt;
};

class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : Module("MSELoss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Reduction reduction;
};

}  // namespace ember::nn
