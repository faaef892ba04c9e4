#include "kernels/cpu/convolution_path.h"

#include "core/cpu_features.h"
#include "core/forced_choice.h"
#include "core/parallel.h"
#include "kernels/cpu/convolution_direct.h"
#include "kernels/cpu/convolution_onednn.h"

namespace ember::cpu {
namespace {

ForcedChoice<ConvPath>& forced_path() {
  static ForcedChoice<ConvPath> forced(
      "EMBER_CONV_PATH", {{"gemm", ConvPath::Gemm}, {"onednn", ConvPath::OneDnn}, {"direct", ConvPath::Direct}});
  return forced;
}

}  // namespace

const char* conv_path_name(ConvPath path) {
  return path == ConvPath::OneDnn ? "onednn" : path == ConvPath::Direct ? "direct" : "gemm";
}

void set_conv_path(std::optional<ConvPath> path) {
  forced_path().set(path);
}

ConvPath conv_path_for(ConvPass pass, const Shape& x, const Shape& weight, const Shape& y,
                       const native::Conv2dParams& params, bool has_bias) {
  const bool direct = (pass == ConvPass::Forward && direct_conv_applies(x, weight, y, params)) ||
                      (pass == ConvPass::BackwardWeight && direct_weight_grad_applies(x, weight, y, params));
  const bool onednn = onednn_conv_supports(pass, x, weight, y, params, has_bias);
  if (const auto forced = forced_path().get()) {
    if (*forced == ConvPath::Direct) return direct ? ConvPath::Direct : ConvPath::Gemm;
    if (*forced == ConvPath::OneDnn) return onednn ? ConvPath::OneDnn : ConvPath::Gemm;
    return ConvPath::Gemm;
  }
  if (direct && weight[1] == 1 && weight[2] * weight[3] >= kDirectMinTaps) return ConvPath::Direct;
  // A batch smaller than the pool would leave threads idle (the batch is what is split); a 1x1
  // kernel does too little work per element for the reorders to pay.
  const int64_t channels = weight[1];
  if (!onednn || channels < kOneDnnMinChannels || weight[2] * weight[3] == 1 || x[0] < get_num_threads())
    return ConvPath::Gemm;
  // With AVX-512, oneDNN's weight gradient runs its AVX-512 kernels and leads at every width.
  if (pass == ConvPass::BackwardWeight && channels > kOneDnnMaxWeightGradChannels &&
      cpu_capability() != CpuCapability::Avx512)
    return ConvPath::Gemm;
  return ConvPath::OneDnn;
}

}  // namespace ember::cpu
