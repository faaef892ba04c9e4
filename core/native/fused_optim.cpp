#include "core/native/fused_optim.h"

namespace ember::native {

EMBER_DEFINE_STUB(adam_step_stub);
EMBER_DEFINE_STUB(sgd_step_stub);

namespace {
void check_same(const char* op, const Tensor& p, const Tensor& t, const char* what) {
  EMBER_CHECK(t.shape() == p.shape(), op, ": ", what, " has shape ", t.shape(), " but the parameter has ",
              p.shape());
  EMBER_CHECK(t.is_contiguous() && t.device() == p.device(), op, ": ", what,
              " must be contiguous and on the parameter's device");
}
}  // namespace

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamStepArgs& args) {
  EMBER_CHECK(param.is_contiguous(), "adam_step: parameter must be contiguous");
  check_same("adam_step", param, grad, "grad");
  check_same("adam_step", param, exp_avg, "exp_avg");
  check_same("adam_step", param, exp_avg_sq, "exp_avg_sq");
  if (param.numel() == 0) return;
  adam_step_stub.call(param.device(), "adam_step")(param, grad, exp_avg, exp_avg_sq, args);
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStepArgs& args) {
  EMBER_CHECK(param.is_contiguous(), "sgd_step: parameter must be contiguous");
  check_same("sgd_step", param, grad, "grad");
  if (buf.defined()) check_same("sgd_step", param, buf, "momentum buffer");
  if (param.numel() == 0) return;
  sgd_step_stub.call(param.device(), "sgd_step")(param, grad, buf, args);
}

}  // namespace ember::native
