#include "distributed/reducer.h"

#include <sstream>

#include "autograd/engine.h"
#include "core/factory.h"
#include "core/grad_mode.h"

namespace ember::distributed {

// Ties the end-of-backward callback to its pass: when the engine drops the callback without
// running it (the pass failed), the Reducer drains its work and starts clean next time.
struct Reducer::PassToken {
  std::weak_ptr<Reducer> reducer;
  bool finished = false;
  ~PassToken() {
    if (finished) return;
    if (auto r = reducer.lock()) r->abandon_pass();
  }
};

std::shared_ptr<Reducer> Reducer::create(NamedParameters params, std::shared_ptr<ProcessGroup> pg,
                                         ReducerOptions options) {
  std::shared_ptr<Reducer> r(new Reducer(std::move(params), std::move(pg), options));
  r->install_hooks();
  return r;
}

Reducer::Reducer(NamedParameters params, std::shared_ptr<ProcessGroup> pg, ReducerOptions options)
    : named_(std::move(params)), pg_(std::move(pg)), options_(options) {
  EMBER_CHECK(pg_ != nullptr, "DistributedDataParallel: process group is null");
  EMBER_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
              options_.bucket_cap_mb);
  for (auto& [name, t] : named_) {
    EMBER_CHECK(t.defined() && t.is_leaf() && t.requires_grad(), "DistributedDataParallel: parameter '", name,
                "' must be a leaf that requires grad");
    params_.push_back(Param{name, t});
  }
  build_buckets();
}

Reducer::~Reducer() {
  remove_hooks();
  // Outstanding collectives write into the bucket buffers; let them land first.
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
  }
}

void Reducer::build_buckets() {
  auto new_bucket = [](DType dt, Device dev) {
    Bucket b;
    b.dtype = dt;
    b.device = dev;
    return b;
  };
  const double cap_bytes = options_.bucket_cap_mb * 1024.0 * 1024.0;
  std::vector<size_t> open;  // index of the open bucket for each dtype/device seen so far
  // Gradients of the last layers arrive first in backward, so they fill the first bucket.
  for (size_t i = params_.size(); i-- > 0;) {
    Param& p = params_[i];
    const DType dt = p.tensor.dtype();
    const Device dev = p.tensor.device();
    size_t* target = nullptr;
    for (size_t& o : open)
      if (buckets_[o].dtype == dt && buckets_[o].device == dev) target = &o;
    if (target == nullptr) {
      open.push_back(buckets_.size());
      buckets_.push_back(new_bucket(dt, dev));
      target = &open.back();
    }
    Bucket* b = &buckets_[*target];
    if (!b->params.empty() && double((b->numel + p.tensor.numel()) * int64_t(dtype_size(dt))) > cap_bytes) {
      *target = buckets_.size();
      buckets_.push_back(new_bucket(dt, dev));
      b = &buckets_.back();
    }
    p.bucket = *target;
    p.offset = b->numel;
    b->params.push_back(i);
    b->numel += p.tensor.numel();
  }
  for (auto& b : buckets_) {
    b.buffer = zeros({b.numel}, {b.dtype, b.device});
    b.pending = b.params.size();
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  hooks_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(params_[i].tensor.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto r = weak.lock()) r->on_gradient_ready(i);
    }));
  }
}

void Reducer::remove_hooks() {
  for (RemovableHandle& h : hooks_) h.remove();
  hooks_.clear();
}

Tensor Reducer::slot(const Param& p) const {
  const Shape& shape = p.tensor.shape();
  return make_view(buckets_[p.bucket].buffer, shape, contiguous_strides(shape), p.offset);
}

bool Reducer::grad_is_slot(const Param& p) const {
  Tensor g = p.tensor.grad();
  const Tensor& buf = buckets_[p.bucket].buffer;
  return g.defined() && g.impl()->storage == buf.impl()->storage && g.storage_offset() == p.offset &&
         g.is_contiguous();
}

void Reducer::on_gradient_ready(size_t index) {
  if (!sync_) return;
  if (!pass_active_) begin_pass();
  Param& p = params_[index];
  EMBER_CHECK(!p.ready, "DistributedDataParallel: parameter '", p.name, "' was marked ready twice in one backward "
              "pass; under DistributedDataParallel a parameter accumulates one gradient per backward pass");
  p.ready = true;
  if (!grad_is_slot(p)) slot(p).copy_(p.tensor.grad());
  Bucket& b = buckets_[p.bucket];
  if (--b.pending == 0) launch_ready_buckets();
}

void Reducer::begin_pass() {
  // Queue the end-of-backward step first: if it cannot be queued, nothing has changed yet.
  auto token = std::make_shared<PassToken>();
  token->reducer = weak_from_this();
  autograd::queue_callback([token] {
    token->finished = true;
    if (auto r = token->reducer.lock()) r->finish_pass();
  });
  pass_active_ = true;
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) launch(next_bucket_++);
}

void Reducer::launch(size_t index) {
  Bucket& b = buckets_[index];
  if (!launched_any_) {
    launched_any_ = true;
    first_launch_ = Clock::now();
  }
  b.work = pg_->allreduce(b.buffer, ReduceOp::Sum);
  stats_.buckets_reduced++;
  stats_.bytes_reduced += b.numel * int64_t(dtype_size(b.dtype));
}

void Reducer::wait_all_launched() {
  for (auto& b : buckets_) {
    if (!b.work) continue;
    std::shared_ptr<Work> w = std::move(b.work);
    w->wait();
  }
}

void Reducer::reset_pass_state() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_bucket_ = 0;
  launched_any_ = false;
  pass_active_ = false;
}

void Reducer::abandon_pass() noexcept {
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
  }
  reset_pass_state();
}

void Reducer::finish_pass() {
  NoGradGuard no_grad;
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].ready) missing.push_back(i);

  if (!missing.empty() && !options_.find_unused_parameters) {
    abandon_pass();
    std::ostringstream names;
    for (size_t k = 0; k < missing.size(); ++k) names << (k ? ", " : "") << "'" << params_[missing[k]].name << "'";
    EMBER_FAIL("DistributedDataParallel: on rank ", pg_->rank(), ", ", missing.size(), " parameter",
               missing.size() == 1 ? "" : "s", " received no gradient in this backward pass: ", names.str(),
               ". Every parameter must contribute to the loss; if some are unused on purpose, construct "
               "DistributedDataParallel with find_unused_parameters = true");
  }

  // A parameter without a gradient in this pass contributes what it has accumulated locally
  // (during no_sync), or zeros. Which ones no rank used is settled by one extra all-reduce.
  Tensor used;
  std::shared_ptr<Work> used_work;
  try {
    for (size_t i : missing) {
      Param& p = params_[i];
      Tensor g = p.tensor.grad();
      if (g.defined()) {
        if (!grad_is_slot(p)) slot(p).copy_(g);
      } else {
        slot(p).zero_();
      }
      buckets_[p.bucket].pending--;
    }
    launch_ready_buckets();
    if (options_.find_unused_parameters) {
      std::vector<float> flags(params_.size());
      for (size_t i = 0; i < params_.size(); ++i)
        flags[i] = params_[i].ready || params_[i].tensor.grad().defined() ? 1.0f : 0.0f;
      used = from_vector<float>(flags);
      if (!params_.empty() && !buckets_.empty() && !buckets_[0].device.is_cpu()) used = used.to(buckets_[0].device);
      used_work = pg_->allreduce(used, ReduceOp::Sum);
    }

    const auto wait_start = Clock::now();
    wait_all_launched();
    if (used_work) used_work->wait();
    const auto wait_end = Clock::now();

    const double inv_world = 1.0 / double(pg_->size());
    for (auto& b : buckets_) b.buffer.mul_(inv_world);
    std::vector<float> used_flags;
    if (used.defined()) used_flags = used.to_vector<float>();
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      if (!used_flags.empty() && used_flags[i] == 0.0f) continue;  // no rank used it: leave .grad alone
      Tensor view = slot(p);
      Tensor g = p.tensor.grad();
      if (options_.gradient_as_bucket_view) {
        if (!grad_is_slot(p)) p.tensor.set_grad(view);
      } else if (g.defined()) {
        g.copy_(view);
      } else {
        p.tensor.set_grad(view.clone());
      }
    }

    using ms = std::chrono::duration<double, std::milli>;
    stats_.steps++;
    stats_.last_exposed_ms = ms(wait_end - wait_start).count();
    stats_.last_comm_ms = launched_any_ ? ms(wait_end - first_launch_).count() : stats_.last_exposed_ms;
    stats_.total_exposed_ms += stats_.last_exposed_ms;
    stats_.total_comm_ms += stats_.last_comm_ms;
  } catch (...) {
    if (used_work) {
      try {
        used_work->wait();
      } catch (...) {
      }
    }
    abandon_pass();
    throw;
  }
  reset_pass_state();
}

std::vector<int64_t> Reducer::bucket_sizes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_) out.push_back(b.numel * int64_t(dtype_size(b.dtype)));
  return out;
}

std::vector<std::vector<std::string>> Reducer::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

}  // namespace ember::distributed
