#include "core/native/amp.h"

#include <cmath>

namespace ember::native {

EMBER_DEFINE_STUB(amp_unscale_stub);

void amp_unscale_(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  EMBER_CHECK(grad.defined(), "amp_unscale_: the gradient is undefined");
  EMBER_CHECK(is_floating(grad.dtype()), "amp_unscale_: expected a floating-point gradient, got ",
              dtype_name(grad.dtype()), " of shape ", grad.shape());
  EMBER_CHECK(found_inf.defined() && found_inf.dtype() == DType::f32 && found_inf.shape() == Shape{1},
              "amp_unscale_: found_inf must be an f32 tensor of shape [1], got ",
              found_inf.defined() ? dtype_name(found_inf.dtype()) : "undefined", " of shape ",
              found_inf.defined() ? found_inf.shape() : Shape{});
  EMBER_CHECK(found_inf.device() == grad.device(), "amp_unscale_: found_inf is on ", found_inf.device(),
              " but the gradient of shape ", grad.shape(), " is on ", grad.device());
  EMBER_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "amp_unscale_: inv_scale must be positive and finite, got ",
              inv_scale);
  // A broadcast (stride-0) gradient would be unscaled once per alias.
  for (int64_t d = 0; d < grad.dim(); ++d)
    EMBER_CHECK(grad.stride(d) != 0 || grad.size(d) <= 1, "amp_unscale_: the gradient of shape ", grad.shape(),
                " with strides ", grad.strides(), " has overlapping elements; cannot unscale it in place");
  if (grad.numel() == 0) return;
  amp_unscale_stub.call(grad.device(), "amp_unscale_")(grad, found_inf, inv_scale);
  grad.bump_version();
  found_inf.bump_version();
}

}  // namespace ember::native
