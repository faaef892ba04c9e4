// save_state / load_state on disk: everything a training run needs to continue exactly where
// it stopped, in one directory per checkpoint (Accelerate's layout, Ember's file formats):
//
//   model.safetensors, model_1.safetensors, ...          prepared models (main process)
//   optimizer.safetensors, optimizer_1.safetensors, ...  optimizer state (main process)
//   scheduler.safetensors, ...                           scheduler state (main process)
//   custom_checkpoint.safetensors, custom_checkpoint_1.safetensors, ...  register_for_checkpointing objects
//   scaler.safetensors                                   fp16 loss scaler (main process)
//   random_states_<rank>.json                            each process's generator state
//   accelerator_state.json                               world size, loader positions, counters
//
// A model under sharded data parallel, and then every optimizer, is saved in pieces instead:
// model.shard-0000r-of-0000N.safetensors from every process (sharded_checkpoint.h), which any
// number of processes and any strategy can load. Another number of processes can load every
// checkpoint.
//
// State that is not a tensor is stored as scalars in the safetensors metadata.
//
// Writing is atomic for the whole directory: the files go into a hidden temporary directory
// next to the target, each one flushed to disk, and only when every process finished is the
// directory renamed into place (an older checkpoint of the same name is replaced only then, by an
// atomic exchange of the two directories where the filesystem supports RENAME_EXCHANGE; else by
// two renames, and a crash between them leaves the old one as ".<name>.old", which load_state
// reads and the next save_state puts back). A crash or a full disk during save_state leaves
// every earlier checkpoint loadable under its name; a failed save reports the file it could not
// write and removes its temporary directory.
// All processes must see the same filesystem (one machine, or a shared one).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "accelerate/accelerated_dataloader.h"
#include "accelerate/accelerator_state.h"
#include "core/rng.h"
#include "distributed/sharded_state.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace ember::distributed {

class FullyShardedDataParallel;

// The saved form of any object: named tensors and named numbers.
struct ObjectState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

// What register_for_checkpointing stores: anything that can give and take an ObjectState.
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;
  virtual ObjectState state_dict() const = 0;
  virtual void load_state_dict(const ObjectState& state) = 0;
  // Raises ember::Error naming the key when load_state_dict(state) would be refused, changing
  // nothing; load_state calls it on every object before it loads any. By default every tensor
  // and scalar key of the object's current state_dict() must be present.
  virtual void validate_state_dict(const ObjectState& state) const;
};

namespace detail {

template <typename S>
ObjectState to_object_state(S&& s) {
  using D = std::decay_t<S>;
  ObjectState out;
  if constexpr (std::is_same_v<D, ObjectState>) {
    out = std::forward<S>(s);
  } else if constexpr (std::is_same_v<D, optim::OptimizerStateDict>) {
    out.tensors = s.tensors;
    out.scalars = s.scalars;
  } else if constexpr (std::is_same_v<D, std::map<std::string, Tensor>>) {
    out.tensors = s;
  } else if constexpr (std::is_same_v<D, std::map<std::string, double>>) {
    out.scalars = s;
  } else {
    static_assert(sizeof(D) == 0,
                  "register_for_checkpointing: state_dict() must return std::map<std::string, Tensor>, "
                  "std::map<std::string, double>, optim::OptimizerStateDict or distributed::ObjectState");
  }
  return out;
}

template <typename S>
S from_object_state(const ObjectState& s) {
  if constexpr (std::is_same_v<S, ObjectState>) {
    return s;
  } else if constexpr (std::is_same_v<S, optim::OptimizerStateDict>) {
    return optim::OptimizerStateDict{s.tensors, s.scalars};
  } else if constexpr (std::is_same_v<S, std::map<std::string, Tensor>>) {
    return s.tensors;
  } else {
    return s.scalars;
  }
}

// Adapts an object with state_dict() / load_state_dict() (held by pointer; the caller keeps it
// alive, or the shared_ptr does).
template <typename T>
class CheckpointableAdapter : public Checkpointable {
 public:
  explicit CheckpointableAdapter(std::shared_ptr<T> obj) : obj_(std::move(obj)) {}
  ObjectState state_dict() const override { return to_object_state(obj_->state_dict()); }
  void load_state_dict(const ObjectState& state) override {
    using S = std::decay_t<decltype(obj_->state_dict())>;
    if constexpr (std::is_same_v<S, std::map<std::string, Tensor>> && std::is_base_of_v<nn::Module, T>) {
      obj_->load_state_dict(from_object_state<S>(state), /*strict=*/true);
    } else {
      obj_->load_state_dict(from_object_state<S>(state));
    }
  }
  // The object's own validate_state_dict where it has one (modules, optimizers, schedulers),
  // else the key check of Checkpointable.
  void validate_state_dict(const ObjectState& state) const override {
    using S = std::decay_t<decltype(obj_->state_dict())>;
    if constexpr (requires(const T& t, const S& s) { t.validate_state_dict(s); }) {
      obj_->validate_state_dict(from_object_state<S>(state));
    } else {
      Checkpointable::validate_state_dict(state);
    }
  }

 private:
  std::shared_ptr<T> obj_;
};

}  // namespace detail

// One checkpoint as this process writes or reads it.
struct CheckpointPayload {
  std::vector<nn::StateDict> models;  // written by the main process only
  std::vector<ObjectState> optimizers;
  // Models and optimizers under sharded data parallel are saved in pieces: every process writes
  // its own file, model[_<i>].shard-<r>-of-<N>.safetensors (sharded_checkpoint.h), and any
  // split reads them back. Saving: this process's pieces (the optimizer's scalars stay in
  // `optimizers`). Loading: the files' pieces, and for a sharded model this process's part of
  // them as the model now splits them, in `model_pieces`.
  std::vector<bool> sharded_models;
  std::vector<bool> sharded_optimizers;
  std::vector<std::optional<PieceMap>> model_pieces;
  std::vector<std::optional<PieceMap>> optimizer_pieces;
  std::vector<std::optional<PieceReader>> saved_model_pieces;
  std::vector<std::optional<PieceReader>> saved_optimizer_pieces;
  int saved_world = 1;  // the number of processes that wrote the checkpoint
  std::vector<ObjectState> schedulers;
  std::vector<ObjectState> custom;
  std::vector<LoaderPosition> dataloaders;
  std::optional<ObjectState> scaler;  // the loss scaler's state (fp16 only)
  GeneratorState rng;                 // this process's
  bool has_rng = true;                // false: a process the saving job did not have keeps its generator
  int64_t accumulation_step = 0;      // micro-steps into the current accumulation window
  int64_t save_iteration = 0;         // automatic naming: the number of this checkpoint
  int64_t backward_passes = 0;        // Accelerator::backward calls of the run, across restarts
  std::string source;                 // read_checkpoint: the directory the files were read from
};

// What load_state restores, in the Accelerator's order. Pointers are borrowed.
struct CheckpointTargets {
  std::vector<nn::Module*> models;
  std::vector<optim::Optimizer*> optimizers;
  std::vector<optim::LRScheduler*> schedulers;
  std::vector<Checkpointable*> custom;
  std::vector<AcceleratedDataLoader*> dataloaders;
  optim::GradScaler* scaler = nullptr;      // the Accelerator's loss scaler, if any
  optim::GradScalerOptions scaler_options;  // a scratch scaler with these checks the saved state
  // Parallel to models: the sharded data parallel wrapper of each (null: none, or one that does
  // not shard); to optimizers: where each parameter's state lies in the model's parameters.
  std::vector<FullyShardedDataParallel*> model_shardings;
  std::vector<std::vector<StateSlot>> optimizer_slots;
};

// Writes `payload` as the checkpoint directory `dir` (a collective: every process calls it; the
// main process writes the shared files, each process its generator state). Any process's
// failure raises the same ember::Error on every process, and `dir` is then left as it was.
void write_checkpoint(const std::string& dir, const CheckpointPayload& payload, const AcceleratorState& state);

// Reads checkpoint `dir` for this process. Raises ember::Error naming the directory when it is
// missing or incomplete, and the file and field when an entry of accelerator_state.json or of this process's random_states_<rank>.json
// is missing or out of range. Files saved in pieces are opened (headers checked) but not read:
// read_and_validate_checkpoint assembles them for the targets. Reading changes nothing.
CheckpointPayload read_checkpoint(const std::string& dir, const AcceleratorState& state);

// load_state in two phases. The first reads checkpoint `dir` (read_checkpoint) and checks every
// file against `targets` (counts, model keys/shapes/dtypes, each optimizer's, scheduler's,
// scaler's and registered object's own validation, loader positions against the loaders),
// changing nothing; errors name the file and the field. It is a collective: when any process
// refuses, every process raises (the others naming the process that refused).
CheckpointPayload read_and_validate_checkpoint(const std::string& dir, const CheckpointTargets& targets,
                                               const AcceleratorState& state);
// The second phase: restores a checkpoint the first phase accepted into `targets`, and this
// process's generator. The registered objects' own load_state_dict runs first, agreed across
// processes; if one still refuses, those already loaded are put back and every process raises
// with nothing changed. What follows was fully checked and does not fail.
void apply_checkpoint(const CheckpointPayload& saved, const CheckpointTargets& targets, const AcceleratorState& state);

// Raises ember::Error naming `file` when `saved` does not fit `model`: missing or unexpected
// keys, different shapes, or dtypes that cannot be converted (nn::loadable_dtype).
void check_model_state(const std::string& file, const nn::Module& model, const nn::StateDict& saved);

// The loss scaler's file in a checkpoint directory, and the file that describes the checkpoint.
inline constexpr const char* kScalerFileName = "scaler.safetensors";
inline constexpr const char* kAcceleratorStateFileName = "accelerator_state.json";

// Checkpoint files: the model, optimizer, ... file name for object `index` of `kind`
// ("model" -> model.safetensors, model_1.safetensors, ...).
std::string checkpoint_file_name(const std::string& kind, size_t index);

// Automatic naming under a project: <project_dir>/checkpoints/checkpoint_<n>.
std::string checkpoints_root(const std::string& project_dir);
std::string checkpoint_dir_name(int64_t iteration);
// Complete checkpoints under `root`, oldest (lowest number) first, as (number, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);
// Removes the oldest checkpoints until at most `total_limit` remain (no-op for total_limit < 0).
// Returns the removed paths.
std::vector<std::string> rotate_checkpoints(const std::string& root, int total_limit);

}  // namespace ember::distributed
