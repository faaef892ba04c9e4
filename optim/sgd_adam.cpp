#include "optim/sgd_adam.h"

#include <cmath>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/native/fused_optim.h"
#include "core/sparse_grad.h"

namespace ember::optim {
namespace {
Tensor dense_grad(const Tensor& p) {
  Tensor g = p.grad();
  return g.is_contiguous() ? g : native::contiguous(g);
}

// A gradient that is rows alone (no dense part) on a CPU table is stepped from the rows, with
// the dense step's results (core/native/fused_optim.h); anything else reads the dense .grad().
bool steps_from_rows(const Tensor& p) {
  return p.has_sparse_grad() && !p.dense_grad_part().defined() && p.device().is_cpu() && p.dim() == 2 &&
         p.is_contiguous() && p.sparse_grad().indices.dtype() == DType::i64;
}

// AdamOptions::lazy_sparse: Adam's rule on the rows a row-sparse gradient touched, the rest of
// the parameter and of its moments left as they are.
void step_touched_rows(const std::string& optimizer, const Tensor& p, const RowSparseGrad& rows, const Tensor& m,
                       const Tensor& v, const native::AdamStepArgs& args) {
  EMBER_CHECK(p.device().is_cpu() && p.is_contiguous(), optimizer, "(lazy_sparse): row-sparse steps run on "
              "contiguous CPU parameters; this one (shape ", p.shape(), ") is on ", p.device(),
              p.is_contiguous() ? "" : " and not contiguous", "; turn lazy_sparse off for a dense step");
  if (rows.nnz_rows() == 0) return;
  const std::vector<int64_t> index = rows.indices.to_vector<int64_t>();
  const size_t row_bytes = size_t(p.size(1)) * dtype_size(p.dtype());
  const auto gather = [&](const Tensor& t) {
    Tensor out = empty({rows.nnz_rows(), p.size(1)}, {p.dtype(), p.device()});
    for (size_t k = 0; k < index.size(); ++k)
      std::memcpy(static_cast<char*>(out.raw_data()) + k * row_bytes,
                  static_cast<const char*>(t.raw_data()) + size_t(index[k]) * row_bytes, row_bytes);
    return out;
  };
  const auto scatter = [&](const Tensor& from, const Tensor& t) {
    for (size_t k = 0; k < index.size(); ++k)
      std::memcpy(static_cast<char*>(t.raw_data()) + size_t(index[k]) * row_bytes,
                  static_cast<const char*>(from.raw_data()) + k * row_bytes, row_bytes);
  };
  const Tensor pr = gather(p), mr = gather(m), vr = gather(v);
  native::adam_step(pr, rows.values, mr, vr, args);
  scatter(pr, p);
  scatter(mr, m);
  scatter(vr, v);
}
}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer("SGD", std::move(groups),
                {{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
                 {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov ? 1.0 : 0.0}}) {
  EMBER_CHECK(o.lr >= 0, "SGD: invalid learning rate ", o.lr);
  EMBER_CHECK(o.momentum >= 0, "SGD: invalid momentum ", o.momentum);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
              "SGD: Nesterov momentum requires a momentum and zero dampening");
}

void SGD::step() {
  NoGradGuard ng;
  for (auto& g : groups_) {
    const double mom = g.get("momentum");
    for (auto& p : g.params) {
      const bool from_rows = steps_from_rows(p);
      if (!from_rows && !p.grad().defined()) continue;
      ParamState& st = state(p);
      native::SgdStepArgs args{g.get("lr"), mom, g.get("dampening"), g.get("weight_decay"),
                               g.get("nesterov") != 0.0, st.step == 0};
      Tensor buf;
      if (mom != 0.0) {
        auto& b = st.buffers["momentum_buffer"];
        if (!b.defined()) b = zeros(p.shape(), {p.dtype(), p.device()});
        buf = b;
      }
      if (from_rows) {
        const RowSparseGrad rows = p.sparse_grad();
        native::sgd_rows_step(p, rows.indices, native::contiguous(rows.values), buf, args);
      } else {
        native::sgd_step(p, dense_grad(p), buf, args);
      }
      ++st.step;
    }
  }
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o, bool decoupled)
    : Optimizer(decoupled ? "AdamW" : "Adam", std::move(groups),
                {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                 {"weight_decay", o.weight_decay}}),
      decoupled_(decoupled),
      lazy_sparse_(o.lazy_sparse) {
  EMBER_CHECK(o.lr >= 0, name_, ": invalid learning rate ", o.lr);
  EMBER_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, name_, ": invalid betas (", o.beta1,
              ", ", o.beta2, ")");
  EMBER_CHECK(o.eps >= 0, name_, ": invalid eps ", o.eps);
}

void Adam::step() {
  NoGradGuard ng;
  for (auto& g : groups_) {
    const double b1 = g.get("beta1"), b2 = g.get("beta2");
    const auto args_at = [&](int64_t step) {
      return native::AdamStepArgs{g.get("lr"),
                                  b1,
                                  b2,
                                  g.get("eps"),
                                  g.get("weight_decay"),
                                  decoupled_,
                                  1.0 - std::pow(b1, double(step)),
                                  1.0 - std::pow(b2, double(step)),
                                  grad_scale_};
    };
    // CUDA parameters are gathered into buckets sharing device, dtypes and step count, each
    // updated by one adam_multi_step (a few launches instead of one per parameter, with
    // bit-identical results); CPU parameters take adam_step one at a time.
    struct Bucket {
      Device device;
      DType param_dtype, grad_dtype;
      int64_t step;
      std::vector<native::AdamTensors> tensors;
    };
    std::vector<Bucket> buckets;
    std::unordered_set<const TensorImpl*> pending;  // parameters in `buckets`
    const auto flush = [&] {
      for (const Bucket& b : buckets) native::adam_multi_step(b.tensors, args_at(b.step));
      buckets.clear();
      pending.clear();
    };
    for (auto& p : g.params) {
      const bool rows_only = lazy_sparse_ && p.has_sparse_grad() && !p.dense_grad_part().defined();
      const bool from_rows = !rows_only && steps_from_rows(p);
      if (!rows_only && !from_rows && !p.grad().defined()) continue;
      ParamState& st = state(p);
      auto& m = st.buffers["exp_avg"];
      auto& v = st.buffers["exp_avg_sq"];
      if (!m.defined()) {
        m = zeros(p.shape(), {p.dtype(), p.device()});
        v = zeros(p.shape(), {p.dtype(), p.device()});
      }
      ++st.step;
      if (rows_only) {
        step_touched_rows(name_, p, p.sparse_grad(), m, v, args_at(st.step));
        continue;
      }
      if (from_rows) {
        const RowSparseGrad rows = p.sparse_grad();
        native::adam_rows_step(p, rows.indices, native::contiguous(rows.values), m, v, args_at(st.step));
        continue;
      }
      const Tensor grad = dense_grad(p);
      if (!p.device().is_cuda()) {
        native::adam_step(p, grad, m, v, args_at(st.step));
        continue;
      }
      // A parameter listed twice takes its updates in list order, as on the CPU.
      if (!pending.insert(p.impl()).second) {
        flush();
        pending.insert(p.impl());
      }
      Bucket* bucket = nullptr;
      for (Bucket& b : buckets)
        if (b.device == p.device() && b.param_dtype == p.dtype() && b.grad_dtype == grad.dtype() && b.step == st.step)
          bucket = &b;
      if (!bucket) bucket = &buckets.emplace_back(Bucket{p.device(), p.dtype(), grad.dtype(), st.step, {}});
      bucket->tensors.push_back({p, grad, m, v});
    }
    flush();
  }
  grad_scale_ = 1.0;
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o)
    : Adam(std::move(groups), AdamOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.lazy_sparse}, true) {}

}  // namespace ember::optim
