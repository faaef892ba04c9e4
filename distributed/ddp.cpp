#include "distributed/ddp.h"

#include <algorithm>
#include <sstream>

#include "core/grad_mode.h"
#include "distributed/model_replica.h"

namespace ember::distributed {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> pg,
                                                 DDPOptions options)
    : model_(std::move(model)), pg_(std::move(pg)), options_(options) {
  EMBER_CHECK(model_ != nullptr, "DistributedDataParallel: model is null");
  EMBER_CHECK(pg_ != nullptr, "DistributedDataParallel: process group is null");
  EMBER_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
              options_.bucket_cap_mb);
  verify_same_model_on_all_ranks(*model_, *pg_, "DistributedDataParallel");

  std::vector<Tensor> state;
  Reducer::NamedParameters trainable;
  for (auto& [name, t] : model_->named_parameters()) {
    state.push_back(t);
    if (t.requires_grad()) trainable.emplace_back(name, t);
  }
  for (auto& [name, t] : model_->named_buffers()) state.push_back(t);
  broadcast_from_rank0(*pg_, state);

  reducer_ = Reducer::create(std::move(trainable), pg_,
                             ReducerOptions{.bucket_cap_mb = options_.bucket_cap_mb,
                                            .first_bucket_cap_mb = options_.first_bucket_cap_mb,
                                            .find_unused_parameters = options_.find_unused_parameters,
                                            .gradient_as_bucket_view = options_.gradient_as_bucket_view,
                                            .static_graph = options_.static_graph});
  if (options_.comm_hook != CommHookType::NONE) reducer_->register_comm_hook(comm_hook_for(options_.comm_hook, options_.powersgd));
}

DistributedDataParallel::~DistributedDataParallel() {
  // The parameters outlive this wrapper: leave no hook of ours on them.
  if (reducer_) reducer_->remove_hooks();
}

void DistributedDataParallel::overlap_optimizer_step(std::shared_ptr<optim::Optimizer> opt) {
  EMBER_CHECK(opt != nullptr, "DistributedDataParallel: overlap_optimizer_step was given a null optimizer");
  reducer_->set_bucket_step([opt](const std::vector<Tensor>& params) { opt->step_only(params); });
}

void DistributedDataParallel::sync_buffers() {
  if (!options_.broadcast_buffers) return;
  std::vector<Tensor> buffers;
  for (auto& [name, t] : model_->named_buffers()) buffers.push_back(t);
  broadcast_from_rank0(*pg_, buffers);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  sync_buffers();
  return model_->forward(x);
}

}  // namespace ember::distributed
