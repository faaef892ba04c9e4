#include "nn/init.h"

#include <cmath>

#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  EMBER_CHECK(w.dim() >= 2, "init: fan in and fan out need a tensor with at least 2 dims, got shape ",
              w.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

namespace {
void assign(Tensor& t, const Tensor& values) {
  NoGradGuard ng;
  t.copy_(values);
}
int64_t pick_fan(const Tensor& t, const std::string& mode) {
  auto [in, out] = fans(t);
  EMBER_CHECK(mode == "fan_in" || mode == "fan_out", "kaiming init: mode must be fan_in or fan_out, got '",
              mode, "'");
  return mode == "fan_in" ? in : out;
}
}  // namespace

void zeros_(Tensor& t) { constant_(t, 0.0); }
void ones_(Tensor& t) { constant_(t, 1.0); }
void constant_(Tensor& t, double value) {
  NoGradGuard ng;
  t.fill_(value);
}

void normal_(Tensor& t, double mean, double std) {
  assign(t, randn(t.shape(), {DType::f32, t.device()}) * std + mean);
}

void uniform_(Tensor& t, double low, double high) {
  assign(t, rand(t.shape(), {DType::f32, t.device()}) * (high - low) + low);
}

void xavier_uniform_(Tensor& t, double gain) {
  auto [in, out] = fans(t);
  const double a = gain * std::sqrt(6.0 / double(in + out));
  uniform_(t, -a, a);
}

void xavier_normal_(Tensor& t, double gain) {
  auto [in, out] = fans(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / double(in + out)));
}

void kaiming_uniform_(Tensor& t, double a, const std::string& mode) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / double(pick_fan(t, mode)));
  uniform_(t, -bound, bound);
}

void kaiming_normal_(Tensor& t, double a, const std::string& mode) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  normal_(t, 0.0, gain / std::sqrt(double(pick_fan(t, mode))));
}

void bert_normal_(Tensor& t, double std) { normal_(t, 0.0, std); }

}  // namespace ember::nn::init
