// The sharded parts of save_state / load_state: models under sharded data parallel and their
// optimizers are saved as each process's pieces of the global tensors (distributed/sharded_state.h)
// and read back under any split: another world size, another strategy, plain DDP or one process.
//
//   model.shard-0000r-of-0000N.safetensors      process r: its piece of every parameter, keyed by
//                                               the parameter's name; the main process also the
//                                               buffers and frozen parameters, whole
//   optimizer.shard-0000r-of-0000N.safetensors  process r: "state.<i>.exp_avg", ... of its pieces,
//                                               placed in the parameter's elements
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "accelerate/checkpointing.h"
#include "distributed/fsdp.h"
#include "distributed/sharded_state.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace ember::distributed {

// One slot per parameter of `opt`, in its state_dict order: a shard view of one of `shardings`
// (null entries are skipped) is its piece of the parameter; any other tensor is a whole one.
std::vector<StateSlot> optimizer_slots(const optim::Optimizer& opt,
                                       const std::vector<std::shared_ptr<FullyShardedDataParallel>>& shardings);

// Whether a model's state is saved in pieces: it is wrapped by a strategy that shards.
bool saves_in_pieces(const FullyShardedDataParallel* f);
// Whether such a model is saved whole instead (state_dict_type FULL_STATE_DICT): model.safetensors
// gathered from the shards, and its optimizers' state gathered into whole tensors.
bool saves_whole(const FullyShardedDataParallel* f);
// FULL_STATE_DICT: an optimizer's state with every piece gathered into the whole tensor of its
// parameter (the union of what the processes hold). Collective; every process gets it all.
optim::OptimizerStateDict whole_optimizer_state(const optim::OptimizerStateDict& sd,
                                                const std::vector<StateSlot>& slots, ProcessGroup& pg);

// Saving: this process's pieces of the model (with_whole_tensors: also the buffers and the
// frozen parameters, which the main process writes) and of an optimizer's state.
PieceMap model_pieces(const FullyShardedDataParallel& f, bool with_whole_tensors);
PieceMap optimizer_pieces(const optim::OptimizerStateDict& sd, const std::vector<StateSlot>& slots);

// Loading, from the saved pieces (any split): the optimizer's state for `slots`; the whole model
// (for a model that is not sharded); this process's pieces of a sharded model, checked against
// it (missing, unexpected and reshaped tensors raise naming `saved.source()`).
ObjectState assemble_optimizer_state(const PieceReader& saved, const std::vector<StateSlot>& slots);
nn::StateDict assemble_whole_model(const PieceReader& saved);
PieceMap assemble_model_pieces(const PieceReader& saved, const FullyShardedDataParallel& f);
// Writes pieces assemble_model_pieces made into the shards (and the whole tensors into the
// model), then regathers what the strategy keeps replicated. Collective.
void load_model_pieces(FullyShardedDataParallel& f, const PieceMap& pieces);

// The files a checkpoint's object `index` of `kind` ("model", "optimizer") was saved in:
// its shard files when it was saved in pieces by `world` processes, else its one file.
PieceReader open_saved_object(const std::string& dir, const std::string& kind, size_t index, bool in_pieces,
                              int world);
// model[_<index>].shard-0000r-of-0000N.safetensors
std::string shard_file_name(const std::string& kind, size_t index, int rank, int world);

// `ember merge-weights`: model `index` of checkpoint `dir` as whole tensors, from its shard
// files or its one file, without building the model.
nn::StateDict merge_checkpoint_model(const std::string& dir, size_t index = 0);

}  // namespace ember::distributed
