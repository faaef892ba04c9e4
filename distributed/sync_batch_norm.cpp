#include "distributed/sync_batch_norm.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions/composed_gradient.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/native/indexing.h"
#include "core/native/normalization.h"
#include "distributed/default_process_group.h"
#include "distributed/sync_batch_norm_gradients.h"

namespace ember::distributed {

namespace {

// The f64 [2C + 1] all-reduce buffer of the forward: sum, sumsq, count.
struct PackedStats {
  Tensor packed;
  int64_t channels;
  native::BatchNormStats view() const {
    return {packed.narrow(0, 0, channels), packed.narrow(0, channels, channels), packed.narrow(0, 2 * channels, 1)};
  }
};

PackedStats all_reduce_stats(const native::BatchNormStats& local, ProcessGroup& pg) {
  PackedStats s{native::cat({local.sum, local.sumsq, local.count}, 0), local.sum.numel()};
  pg.allreduce(s.packed)->wait();
  return s;
}

}  // namespace

Tensor sync_batch_norm(const Tensor& input_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight_in, const Tensor& bias_in, double momentum, double eps,
                       const std::shared_ptr<ProcessGroup>& pg, const char* layer) {
  EMBER_CHECK(pg != nullptr, layer, ": sync_batch_norm needs a process group");
  const Tensor x = autocast::to_f32(input_in), weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  native::check_batch_norm_params(x, running_mean, running_var, weight, bias);
  const PackedStats global = all_reduce_stats(native::batch_norm_stats(x), *pg);
  const native::BatchNormStats sums = global.view();
  const double count = sums.count.item<double>();
  // every rank sees the same global count, so every rank raises this together
  EMBER_CHECK(count > 1, layer, ": expected more than 1 value per channel over all ", pg->size(),
              " ranks when training, got ", count, " (input of shape ", x.shape(), " on rank ", pg->rank(), ")");
  const native::BatchNormMeanInvstd st =
      native::batch_norm_gather_stats(sums, x.dtype(), running_mean, running_var, momentum, eps);
  Tensor y = native::batch_norm_elemt(x, st.mean, st.invstd, weight, bias);
  if (!autograd::needs_grad({x, weight, bias})) return y;

  const bool need_dx = x.requires_grad(), need_dw = weight.defined() && weight.requires_grad(),
             need_db = bias.defined() && bias.requires_grad();
  // x and the weight keep their history for the composed gradients of a create_graph backward
  const autograd::SavedTensor saved_x = autograd::save_with_history(x), saved_w = autograd::save_with_history(weight),
                              saved_b = autograd::save(bias);
  const Tensor mean = st.mean, invstd = st.invstd, global_count = sums.count;
  const int64_t channels = global.channels;
  const SyncBatchStats stats{mean, invstd, count, eps};
  autograd::record(
      "SyncBatchNormBackward", {x, weight, bias}, {y},
      [=](const autograd::Tensors& g) -> autograd::Tensors {
        const Tensor xv = saved_x.unpack(), wv = saved_w.unpack();
        // every rank joins the all-reduce below, also one whose output received no gradient
        const Tensor dy = g[0].defined() ? g[0] : zeros_like(xv);
        const native::BatchNormReduced r =
            native::batch_norm_backward_reduce(dy, xv, mean, invstd, wv, saved_b.unpack(), need_dw, need_db);
        Tensor dx;
        if (need_dx) {
          Tensor reduced = native::cat({r.sum_dy, r.sum_dy_xmu}, 0);
          pg->allreduce(reduced)->wait();
          dx = native::batch_norm_backward_elemt(dy, xv, mean, invstd, wv, reduced.narrow(0, 0, channels),
                                                 reduced.narrow(0, channels, channels), global_count);
        }
        // the values stay the kernels'; under create_graph they get the composed gradients' history
        return autograd::with_composed_history(
            "SyncBatchNormGradBackward", {dx, r.dweight, r.dbias}, {dy, xv, wv},
            [&] { return sync_batch_norm_gradients(dy, xv, wv, stats, {need_dx, need_dw, need_db}, pg); });
      },
      autograd::Backward::differentiable);
  return y;
}

}  // namespace ember::distributed

namespace ember::nn {

SyncBatchNorm::SyncBatchNorm(int64_t num_features, BatchNormOptions opt,
                             std::shared_ptr<distributed::ProcessGroup> process_group)
    : BatchNormBase("SyncBatchNorm", num_features, opt), process_group_(std::move(process_group)) {}

SyncBatchNorm::SyncBatchNorm(const BatchNormBase& bn, std::shared_ptr<distributed::ProcessGroup> process_group)
    : BatchNormBase("SyncBatchNorm", bn), process_group_(std::move(process_group)) {}

std::shared_ptr<distributed::ProcessGroup> SyncBatchNorm::process_group() const {
  return process_group_ ? process_group_ : distributed::default_process_group();
}

void SyncBatchNorm::check_input_dim(const Tensor& x) const {
  EMBER_CHECK(x.dim() >= 2, "SyncBatchNorm: expected an input of shape [N, C, *] (2 or more dims), got ", x.dim(),
              "D input of shape ", x.shape());
}

Tensor SyncBatchNorm::normalize(const Tensor& x, double momentum) {
  const auto pg = is_training() ? process_group() : nullptr;
  if (!pg || pg->size() == 1) return BatchNormBase::normalize(x, momentum);
  if (channels_checked_.lock() != pg) {
    check_channels_agree(*pg);
    channels_checked_ = pg;
  }
  return distributed::sync_batch_norm(x, running_mean, running_var, weight, bias, momentum, options.eps, pg);
}

void SyncBatchNorm::check_channels_agree(distributed::ProcessGroup& pg) {
  distributed::Bytes mine(sizeof(int64_t));
  std::memcpy(mine.data(), &num_features, sizeof(int64_t));
  const std::vector<distributed::Bytes> all = pg.allgather_bytes(mine);
  const auto channels_of = [&](size_t r) {
    EMBER_CHECK(all[r].size() == sizeof(int64_t), "SyncBatchNorm: rank ", r, " sent ", all[r].size(),
                " bytes for its channel count, expected ", sizeof(int64_t));
    int64_t c = 0;
    std::memcpy(&c, all[r].data(), sizeof(int64_t));
    return c;
  };
  const int64_t first = channels_of(0);
  for (size_t r = 1; r < all.size(); ++r) {
    const int64_t c = channels_of(r);
    EMBER_CHECK(c == first, "SyncBatchNorm: rank ", r, " has ", c, " channels (num_features) but rank 0 has ", first,
                "; the layer must have the same channel count on every rank (seen from rank ", pg.rank(), ")");
  }
}

namespace {

// A parent's child swapped by the conversion, to put back if a later parent refuses.
struct Replaced {
  std::shared_ptr<Module> parent;
  std::string name;
  std::shared_ptr<Module> old;
};

struct Converter {
  std::shared_ptr<distributed::ProcessGroup> process_group;
  std::map<const Module*, std::shared_ptr<Module>> converted;  // a layer shared by two parents converts once
  std::vector<Replaced> done;

  std::shared_ptr<Module> convert(const std::shared_ptr<Module>& m) {
    if (auto bn = std::dynamic_pointer_cast<BatchNormBase>(m); bn && !std::dynamic_pointer_cast<SyncBatchNorm>(m)) {
      auto& sync = converted[m.get()];
      if (!sync) sync = std::make_shared<SyncBatchNorm>(*bn, process_group);
      return sync;
    }
    for (const auto& [name, child] : m->named_children()) {
      auto replacement = convert(child);
      if (replacement == child) continue;
      m->replace_child(name, replacement);
      done.push_back({m, name, child});
    }
    return m;
  }
};

}  // namespace

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> model,
                                               std::shared_ptr<distributed::ProcessGroup> process_group) {
  EMBER_CHECK(model != nullptr, "convert_sync_batchnorm: the model is null");
  Converter converter{std::move(process_group), {}, {}};
  try {
    return converter.convert(model);
  } catch (...) {
    for (auto it = converter.done.rbegin(); it != converter.done.rend(); ++it) it->parent->replace_child(it->name, it->old);
    throw;
  }
}

}  // namespace ember::nn
