// SyncBatchNorm: batch normalisation whose training statistics span every rank of a process
// group, as torch.nn.SyncBatchNorm, and convert_sync_batchnorm, which puts it in the place of
// a model's BatchNorm1d / BatchNorm2d layers. It lives here, not in nn/, because it speaks to
// a process group.
//
// A training forward all-reduces, in one collective, each rank's per-channel sums, sums of
// squares and value count (2C + 1 f64 values), so ranks may hold different batch sizes, even
// none; the backward all-reduces sum(dy) and sum(dy * (x - mean)) (2C f64 values) when the
// input needs a gradient. weight and bias get this rank's own gradients (DDP averages them).
// The gradients can be differentiated again (autograd::grad with create_graph, on every rank):
// their values stay those above, and their history, composed from differentiable ops, all-reduces
// four more sums of C values, as does a backward through it (sync_batch_norm_gradients.h).
// The first synchronised forward of a layer on a group also exchanges every rank's channel
// count once (8 bytes per rank), so a rank whose layer differs fails on every rank at once.
#pragma once
#include <memory>

#include "distributed/process_group.h"
#include "nn/layers/normalization.h"

namespace ember::distributed {

// Training-mode batch norm of input [N, C, *] with statistics over every rank of `pg`: the
// running statistics (undefined, or [C]) move towards the global ones, identically on every
// rank. weight and bias [C] or undefined. Every rank calls it with the same C. `layer` names
// the caller in errors.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<ProcessGroup>& pg, const char* layer = "SyncBatchNorm");

}  // namespace ember::distributed

namespace ember::nn {

// Input [N, C, *]. Parameters, buffers, options and state-dict names as BatchNorm1d/2d. In
// training with a group of more than one rank, the batch statistics are those of the batches of
// all ranks together; in evaluation, with one rank or with no group it is exactly BatchNorm.
class SyncBatchNorm : public BatchNormBase {
 public:
  // process_group nullptr: distributed::default_process_group(), read at each forward.
  explicit SyncBatchNorm(int64_t num_features, BatchNormOptions opt = {},
                         std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);
  // The layer `bn` becomes: its very parameters and buffers, options and training mode.
  explicit SyncBatchNorm(const BatchNormBase& bn, std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);

  // The group named at construction, else the default one (nullptr when there is none).
  std::shared_ptr<distributed::ProcessGroup> process_group() const;

 protected:
  void check_input_dim(const Tensor& x) const override;
  Tensor normalize(const Tensor& x, double momentum) override;

 private:
  // Throws on every rank when some rank's layer has another channel count.
  void check_channels_agree(distributed::ProcessGroup& pg);

  std::shared_ptr<distributed::ProcessGroup> process_group_;
  // The group whose channel counts were found to agree (checked once per group).
  std::weak_ptr<distributed::ProcessGroup> channels_checked_;
};

// `model` with every BatchNorm1d / BatchNorm2d, at any depth, replaced by a SyncBatchNorm
// holding the same tensors (an optimizer built before or after sees the same parameters) in the
// same mode, as torch's SyncBatchNorm.convert_sync_batchnorm; layers that already are
// SyncBatchNorm stay as they are. Returns the new layer when `model` itself is a batch norm,
// else `model`. Parents are changed through Module::replace_child: one that refuses (a custom
// module holding the layer in a member) is an ember::Error, and the model is left as it was.
std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> model,
                                               std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);

}  // namespace ember::nn
