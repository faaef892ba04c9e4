// Parameter initialisers (in place, no autograd), with PyTorch's names and conventions.
#pragma once
#include "core/tensor.h"

namespace ember::nn::init {

// fan_in / fan_out of a weight: dim 1 / dim 0 times the receptive field (dims 2..).
std::pair<int64_t, int64_t> fans(const Tensor& w);

void zeros_(Tensor& t);
void ones_(Tensor& t);
void constant_(Tensor& t, double value);
void normal_(Tensor& t, double mean = 0.0, double std = 1.0);
void uniform_(Tensor& t, double low = 0.0, double high = 1.0);
void xavier_uniform_(Tensor& t, double gain = 1.0);
void xavier_normal_(Tensor& t, double gain = 1.0);
// mode "fan_in" or "fan_out"; gain for leaky_relu with slope a: sqrt(2 / (1 + a^2)).
void kaiming_uniform_(Tensor& t, double a = 0.0, const std::string& mode = "fan_in");
void kaiming_normal_(Tensor& t, double a = 0.0, const std::string& mode = "fan_in");
// BERT's initialiser: normal(0, initializer_range) (0.02 by default).
void bert_normal_(Tensor& t, double std = 0.02);

}  // namespace ember::nn::init
