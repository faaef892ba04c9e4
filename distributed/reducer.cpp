#include "distributed/reducer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "autograd/engine.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/sparse_grad.h"

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
  EMBER_CHECK(options_.first_bucket_cap_mb > 0, "DistributedDataParallel: first_bucket_cap_mb must be positive, got ",
              options_.first_bucket_cap_mb);
  debug_ = debug_level();
  for (auto& [name, t] : named_) {
    EMBER_CHECK(t.defined() && t.is_leaf() && t.requires_grad(), "DistributedDataParallel: parameter '", name,
                "' must be a leaf that requires grad");
    params_.push_back(Param{name, t});
    params_.back().row_sparse = t.row_sparse_grad();
  }
  // Gradients of the last layers usually arrive first in backward, so they fill the first bucket.
  std::vector<size_t> reverse;
  for (size_t i = params_.size(); i-- > 0;) reverse.push_back(i);
  build_buckets(reverse);
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

void Reducer::build_buckets(const std::vector<size_t>& order) {
  auto new_bucket = [](DType dt, Device dev) {
    Bucket b;
    b.dtype = dt;
    b.device = dev;
    return b;
  };
  buckets_.clear();
  const double mb = 1024.0 * 1024.0;
  const double cap_bytes = options_.bucket_cap_mb * mb;
  const double first_cap_bytes = std::min(options_.first_bucket_cap_mb, options_.bucket_cap_mb) * mb;
  std::vector<size_t> open;  // index of the open bucket for each dtype/device seen so far
  for (size_t i : order) {
    Param& p = params_[i];
    if (!p.dense_slot) continue;
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
    const double cap = *target == 0 ? first_cap_bytes : cap_bytes;
    if (!b->params.empty() && double((b->numel + p.tensor.numel()) * int64_t(dtype_size(dt))) > cap) {
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

void Reducer::rebuild_buckets_from_first_pass() {
  // Rank 0 decides: its order travels to every rank, so all of them build the same layout.
  const size_t n = params_.size();
  Bytes mine(ready_order_.size() * sizeof(int64_t));
  for (size_t k = 0; k < ready_order_.size(); ++k) {
    const int64_t v = int64_t(ready_order_[k]);
    std::memcpy(mine.data() + k * sizeof v, &v, sizeof v);
  }
  const std::vector<Bytes> all = pg_->allgather_bytes(mine);
  EMBER_CHECK(!all.empty() && all[0].size() % sizeof(int64_t) == 0,
              "DistributedDataParallel: rank 0's gradient order is malformed (", all.empty() ? 0 : all[0].size(),
              " bytes)");
  std::vector<bool> placed(n, false);
  std::vector<size_t> order;
  for (size_t k = 0; k < all[0].size() / sizeof(int64_t); ++k) {
    int64_t v = 0;
    std::memcpy(&v, all[0].data() + k * sizeof v, sizeof v);
    EMBER_CHECK(v >= 0 && size_t(v) < n && !placed[size_t(v)], "DistributedDataParallel: rank 0's gradient order "
                "names parameter ", v, " of ", n, " (twice or out of range); do all ranks wrap the same model?");
    placed[size_t(v)] = true;
    order.push_back(size_t(v));
  }
  layout_order_ = order;
  // Parameters with no gradient in that pass (unused) go last, in reverse registration order;
  // a row-sparse table that had no dense part keeps no slot at all.
  for (size_t i = n; i-- > 0;) {
    if (placed[i]) continue;
    if (params_[i].row_sparse) {
      params_[i].dense_slot = false;
    } else {
      order.push_back(i);
    }
  }
  ranks_with_other_order_ = 0;
  for (const auto& theirs : all) ranks_with_other_order_ += theirs != all[0] ? 1 : 0;

  // A .grad that is a view into the old buffers moves into its slot of the new ones.
  std::vector<Tensor> moved(n);
  if (options_.gradient_as_bucket_view)
    for (size_t i = 0; i < n; ++i)
      if (params_[i].dense_slot && grad_is_slot(params_[i])) moved[i] = params_[i].tensor.dense_grad_part();
  build_buckets(order);
  for (size_t i = 0; i < n; ++i) {
    if (!moved[i].defined()) continue;
    Tensor view = slot(params_[i]);
    view.copy_(moved[i]);
    params_[i].tensor.set_grad(view);
  }
  rebuilt_ = true;
  ready_order_.clear();
  ready_order_.shrink_to_fit();
  if (debug_ != DebugLevel::Off) std::fprintf(stderr, "%s", layout_report().c_str());
}

void Reducer::write_back(Param& p) {
  Tensor view = slot(p);
  Tensor g = p.tensor.dense_grad_part();
  if (options_.gradient_as_bucket_view) {
    if (!grad_is_slot(p)) p.tensor.set_grad(view);
  } else if (g.defined()) {
    g.copy_(view);
  } else {
    p.tensor.set_grad(view.clone());
  }
}

void Reducer::set_bucket_step(BucketStep step) {
  EMBER_CHECK(!options_.find_unused_parameters, "DistributedDataParallel: the optimizer step cannot overlap "
              "communication with find_unused_parameters (which parameters no rank used is known only at the end)");
  EMBER_CHECK(!pass_active_, "DistributedDataParallel: set the overlapped optimizer between backward passes");
  bucket_step_ = std::move(step);
}

void Reducer::check_static_graph(const std::vector<size_t>& missing) const {
  std::vector<bool> now(params_.size(), false);
  for (size_t i : missing) now[i] = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (now[i] == (*first_pass_missing_)[i]) continue;
    EMBER_FAIL("DistributedDataParallel: static_graph, but on rank ", pg_->rank(), " parameter '", params_[i].name,
               "' ", now[i] ? "received no gradient in this pass and did" : "received a gradient in this pass and did "
               "not", " in the first one; construct it with static_graph = false when the used parameters change");
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  hooks_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(params_[i].tensor.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto r = weak.lock()) r->on_gradient_ready(i);
    }));
    if (!params_[i].row_sparse) continue;
    hooks_.push_back(params_[i].tensor.register_post_accumulate_sparse_grad_hook([weak](const Tensor&) {
      if (auto r = weak.lock()) r->on_sparse_gradient_ready();
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
  Tensor g = p.tensor.dense_grad_part();
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
  EMBER_CHECK(p.dense_slot, "DistributedDataParallel: on rank ", pg_->rank(), " the row-sparse table '", p.name,
              "' received a dense gradient, but in the first pass it had only lookup rows, so it has no bucket; "
              "a table whose dense uses change between passes needs Embedding::set_sparse(false)");
  p.ready = true;
  if (!rebuilt_) ready_order_.push_back(index);
  if (!grad_is_slot(p)) slot(p).copy_(p.tensor.dense_grad_part());
  Bucket& b = buckets_[p.bucket];
  if (--b.pending == 0) launch_ready_buckets();
}

void Reducer::on_sparse_gradient_ready() {
  // The rows wait on the table until the end of backward: reduce_sparse_rows sends them.
  if (sync_ && !pass_active_) begin_pass();
}

std::vector<Tensor> Reducer::row_sparse_tensors() const {
  std::vector<Tensor> out;
  for (const Param& p : params_)
    if (p.row_sparse) out.push_back(p.tensor);
  return out;
}

void Reducer::reduce_sparse_rows(const std::vector<RowSparseGrad>& local) {
  const double inv_world = 1.0 / double(pg_->size());
  size_t table = 0;
  for (Param& p : params_) {
    if (!p.row_sparse) continue;
    // Every rank sends its rows (none is an empty piece), in parameter order, so the
    // collectives match; the rows are summed in rank order, as a dense all-reduce would.
    const RowSparseGrad& mine = local.at(table++);
    const int64_t width = p.tensor.size(1);
    const Device dev = p.tensor.device();
    Tensor indices = mine.defined() ? mine.indices : empty({0}, {DType::i64});
    Tensor values = mine.defined() ? mine.values : empty({0, width}, {p.tensor.dtype(), dev});
    if (!dev.is_cpu()) indices = indices.to(dev);
    const std::vector<Tensor> all_indices = pg_->allgather(indices);
    const std::vector<Tensor> all_values = pg_->allgather(values);
    std::vector<RowSparseGrad> parts;
    for (size_t r = 0; r < all_indices.size(); ++r)
      parts.push_back(RowSparseGrad{all_indices[r].to(Device::cpu()), all_values[r], p.tensor.size(0)});
    RowSparseGrad sum = merge_row_sparse(parts);
    if (!sum.defined()) sum = RowSparseGrad{indices.to(Device::cpu()), values, p.tensor.size(0)};
    p.tensor.set_sparse_grad(scale_rows(sum, inv_world));
    const int64_t sent = indices.numel() * int64_t(sizeof(int64_t)) + values.numel() * int64_t(dtype_size(values.dtype()));
    stats_.sparse_gathers++;
    stats_.sparse_bytes += sent;
    stats_.bytes_reduced += sent;
  }
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
  if (!hook_) {
    b.work = pg_->allreduce(b.buffer, ReduceOp::Sum);
    stats_.bytes_reduced += b.numel * int64_t(dtype_size(b.dtype));
  } else {
    GradBucket gb;
    gb.index = index;
    gb.is_last = index + 1 == buckets_.size();
    gb.buffer = b.buffer;
    for (size_t i : b.params) {
      gb.parameter_names.push_back(params_[i].name);
      gb.parameter_shapes.push_back(params_[i].tensor.shape());
    }
    gb.process_group = pg_.get();
    b.work = hook_(gb);
    EMBER_CHECK(b.work != nullptr, "DistributedDataParallel: the comm hook returned no work for bucket ", index,
                " on rank ", pg_->rank());
    stats_.bytes_reduced += gb.wire_bytes;
  }
  stats_.buckets_reduced++;
}

void Reducer::register_comm_hook(CommHook hook) {
  EMBER_CHECK(static_cast<bool>(hook), "DistributedDataParallel: register_comm_hook was given an empty hook");
  EMBER_CHECK(!hook_, "DistributedDataParallel: a comm hook is already registered (one per wrapper, as in torch)");
  EMBER_CHECK(!pass_active_ && stats_.steps == 0, "DistributedDataParallel: register_comm_hook must come before "
              "the first synchronised backward pass");
  hook_ = std::move(hook);
}

void Reducer::wait_all_launched() {
  for (auto& b : buckets_) {
    if (!b.work) continue;
    std::shared_ptr<Work> w = std::move(b.work);
    w->wait();
  }
}

void Reducer::reset_pass_state() {
  if (!rebuilt_) ready_order_.clear();
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
    if (!params_[i].ready && !params_[i].row_sparse) missing.push_back(i);

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
    // A gradient that did not come in this pass (a table's dense part, an unused parameter's)
    // is what the parameter holds locally, or zeros.
    const auto contribute_local = [&](Param& p) {
      Tensor g = p.tensor.dense_grad_part();
      if (g.defined()) {
        if (!grad_is_slot(p)) slot(p).copy_(g);
      } else {
        slot(p).zero_();
      }
      buckets_[p.bucket].pending--;
    };
    for (Param& p : params_)
      if (p.row_sparse && p.dense_slot && !p.ready) contribute_local(p);
    for (size_t i : missing) contribute_local(params_[i]);
    launch_ready_buckets();
    const bool usage_known = options_.static_graph && first_pass_missing_.has_value();
    if (options_.find_unused_parameters && !usage_known) {
      std::vector<float> flags(params_.size());
      for (size_t i = 0; i < params_.size(); ++i)
        flags[i] = params_[i].ready || params_[i].tensor.dense_grad_part().defined() ? 1.0f : 0.0f;
      used = from_vector<float>(flags);
      if (!params_.empty() && !buckets_.empty() && !buckets_[0].device.is_cpu()) used = used.to(buckets_[0].device);
      used_work = pg_->allreduce(used, ReduceOp::Sum);
      stats_.usage_reductions++;
    }

    // With an overlapped optimizer each bucket is averaged, written back and stepped as soon
    // as it lands, while the later buckets are still on the wire.
    const bool overlap = static_cast<bool>(bucket_step_);
    const double inv_world = 1.0 / double(pg_->size());
    // The tables' local rows, taken before write_back gives them a new .grad (which drops rows).
    std::vector<RowSparseGrad> local_rows;
    for (const Tensor& t : row_sparse_tensors()) local_rows.push_back(t.sparse_grad());
    // First pass: a table that had a dense part on no rank keeps only its rows (no .grad of
    // zeros, so a lazy optimizer sees a row-sparse gradient) and loses its slot.
    std::vector<bool> rows_only(params_.size(), false);
    if (!rebuilt_ && !local_rows.empty()) {
      std::vector<float> had_dense;
      for (const Param& p : params_)
        if (p.row_sparse) had_dense.push_back(p.ready || p.tensor.dense_grad_part().defined() ? 1.0f : 0.0f);
      Tensor flags = from_vector<float>(had_dense);
      if (!buckets_.empty() && !buckets_[0].device.is_cpu()) flags = flags.to(buckets_[0].device);
      pg_->allreduce(flags, ReduceOp::Sum)->wait();
      const std::vector<float> any = flags.to_vector<float>();
      size_t t = 0;
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].row_sparse) rows_only[i] = any[t++] == 0.0f;
    }
    const auto write_back_dense = [&](size_t i) {
      if (!rows_only[i]) write_back(params_[i]);
    };
    const auto wait_start = Clock::now();
    Clock::duration waited{};
    if (overlap) {
      for (size_t k = 0; k < buckets_.size(); ++k) {
        Bucket& b = buckets_[k];
        const auto w0 = Clock::now();
        if (b.work) std::exchange(b.work, nullptr)->wait();
        waited += Clock::now() - w0;
        if (!hook_) b.buffer.mul_(inv_world);
        std::vector<Tensor> stepped;
        for (size_t i : b.params) {
          write_back_dense(i);
          if (!params_[i].row_sparse) stepped.push_back(params_[i].tensor);  // stepped once its rows are in
        }
        if (!stepped.empty()) bucket_step_(stepped);
      }
      const auto w0 = Clock::now();
      reduce_sparse_rows(local_rows);
      waited += Clock::now() - w0;
      const std::vector<Tensor> tables = row_sparse_tensors();
      if (!tables.empty()) bucket_step_(tables);
    } else {
      wait_all_launched();
      if (used_work) used_work->wait();
      waited = Clock::now() - wait_start;
    }
    auto wait_end = Clock::now();
    if (usage_known) check_static_graph(missing);

    std::vector<float> used_flags = usage_known ? static_used_flags_ : std::vector<float>{};
    if (used.defined()) used_flags = used.to_vector<float>();
    if (options_.static_graph && !first_pass_missing_) {
      first_pass_missing_ = std::vector<bool>(params_.size(), false);
      for (size_t i : missing) (*first_pass_missing_)[i] = true;
      static_used_flags_ = used_flags;
    }
    if (!overlap) {
      if (!hook_)  // a hook leaves the average itself
        for (auto& b : buckets_) b.buffer.mul_(inv_world);
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!params_[i].dense_slot) continue;
        if (used_flags.empty() || used_flags[i] != 0.0f) write_back_dense(i);  // else no rank used it
      }
      const auto w0 = Clock::now();
      reduce_sparse_rows(local_rows);  // after write_back, which may give a table a new .grad
      waited += Clock::now() - w0;
      wait_end += Clock::now() - w0;
    }

    using ms = std::chrono::duration<double, std::milli>;
    stats_.steps++;
    stats_.last_exposed_ms = ms(waited).count();
    stats_.last_comm_ms = launched_any_ ? ms(wait_end - first_launch_).count() : stats_.last_exposed_ms;
    stats_.total_exposed_ms += stats_.last_exposed_ms;
    stats_.total_comm_ms += stats_.last_comm_ms;
    if (debug_ == DebugLevel::Detail) std::fprintf(stderr, "%s", step_report().c_str());
    for (size_t i = 0; i < params_.size(); ++i)
      if (rows_only[i]) params_[i].dense_slot = false;
    if (!rebuilt_) rebuild_buckets_from_first_pass();
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
