#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"

namespace ember {
namespace {

// Flattened concatenation of all outputs as doubles.
std::vector<double> flat_outputs(const std::vector<Tensor>& outs) {
  std::vector<double> v;
  for (const auto& o : outs) {
    auto x = o.to_vector<double>();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

}  // namespace

GradcheckResult gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs_in, GradcheckOptions opt) {
  // Own contiguous copies so perturbation writes never reach the caller's tensors.
  std::vector<Tensor> inputs;
  for (const auto& t : inputs_in) {
    if (!t.defined()) {
      inputs.push_back(t);
      continue;
    }
    EMBER_CHECK(!t.requires_grad() || t.dtype() == DType::f64,
                "gradcheck: inputs that require grad must be float64, got ", dtype_name(t.dtype()));
    Tensor c = native::clone(t.detach());
    if (t.requires_grad()) c.requires_grad_(true);
    inputs.push_back(c);
  }

  std::vector<Tensor> outs = fn(inputs);
  const std::vector<double> base = flat_outputs(outs);
  const size_t n_out = base.size();

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    const int64_t n_in = x.numel();
    // numeric[j][i] = d out_j / d x_i
    std::vector<std::vector<double>> numeric(n_out, std::vector<double>(size_t(n_in)));
    double* px = x.data_ptr<double>();
    for (int64_t i = 0; i < n_in; ++i) {
      const double orig = px[i];
      std::vector<double> plus, minus;
      {
        NoGradGuard ng;
        px[i] = orig + opt.eps;
        plus = flat_outputs(fn(inputs));
        px[i] = orig - opt.eps;
        minus = flat_outputs(fn(inputs));
        px[i] = orig;
      }
      for (size_t j = 0; j < n_out; ++j) numeric[j][size_t(i)] = (plus[j] - minus[j]) / (2 * opt.eps);
    }
    // analytic: one backward per output element
    size_t j = 0;
    for (size_t o = 0; o < outs.size(); ++o) {
      for (int64_t e = 0; e < outs[o].numel(); ++e, ++j) {
        std::vector<Tensor> fresh = fn(inputs);
        if (!fresh[o].requires_grad()) {
          // output does not depend on any input: analytic gradient is zero
          for (int64_t i = 0; i < n_in; ++i) {
            if (std::abs(numeric[j][size_t(i)]) > opt.atol) {
              std::ostringstream ss;
              ss << "gradcheck: output " << o << " has no grad_fn but numeric d/d input " << k << "[" << i
                 << "] = " << numeric[j][size_t(i)];
              return {false, ss.str()};
            }
          }
          continue;
        }
        Tensor seed = zeros(fresh[o].shape(), {fresh[o].dtype()});
        seed.view({-1}).select(0, e).fill_(1.0);
        x.set_grad(Tensor());
        autograd::run_backward({fresh[o]}, {seed}, false);
        Tensor g = x.grad();
        std::vector<double> ga = g.defined() ? g.to_vector<double>() : std::vector<double>(size_t(n_in), 0.0);
        for (int64_t i = 0; i < n_in; ++i) {
          const double a = ga[size_t(i)], nu = numeric[j][size_t(i)];
          if (std::abs(a - nu) > opt.atol + opt.rtol * std::abs(nu)) {
            std::ostringstream ss;
            ss << "gradcheck: input " << k << " element " << i << ", output " << o << " element " << e
               << ": analytic " << a << " vs numeric " << nu;
            return {false, ss.str()};
          }
        }
      }
    }
    x.set_grad(Tensor());
  }
  return result;
}

GradcheckResult gradgradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                              const std::vector<Tensor>& inputs, GradcheckOptions opt) {
  std::vector<Tensor> outs;
  {
    EnableGradGuard with_grad;
    outs = fn(inputs);
  }
  // Seeds from a fixed pattern in [-1, 1], none zero, so every output's gradient takes part.
  std::vector<Tensor> args = inputs;
  for (const Tensor& o : outs) {
    std::vector<double> v(size_t(o.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(int(i * 7 % 11) - 5) / 5.0 + 0.1;
    // from_vector reads an empty shape as 1-D: a 0-d output gets its shape by reshape.
    args.push_back(from_vector(v, {int64_t(v.size())}, {DType::f64}).reshape(o.shape()).requires_grad_());
  }
  const size_t n_inputs = inputs.size();
  auto first_order = [&fn, n_inputs](const std::vector<Tensor>& all) {
    // gradcheck runs the numeric probes under no-grad mode: those need no graph of the gradient.
    const bool create_graph = GradMode::is_enabled();
    EnableGradGuard with_grad;
    const std::vector<Tensor> ins(all.begin(), all.begin() + int64_t(n_inputs));
    const std::vector<Tensor> seeds(all.begin() + int64_t(n_inputs), all.end());
    std::vector<Tensor> wrt;
    for (const Tensor& t : ins)
      if (t.defined() && t.requires_grad()) wrt.push_back(t);
    std::vector<Tensor> grads = autograd::grad(fn(ins), wrt, seeds, create_graph);
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined()) grads[i] = zeros(wrt[i].shape(), {wrt[i].dtype()});
    return grads;
  };
  return gradcheck(first_order, args, opt);
}

}  // namespace ember
