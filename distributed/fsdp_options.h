// The options of sharded data parallel (distributed/fsdp.h), named after Hugging Face
// Accelerate's FullyShardedDataParallelPlugin. Fields are declared in the order of
// docs/sharded_data_parallel.md's table, which designated initialisers must follow.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ember::distributed {

// What is split across ranks. DeepSpeed's stage numbers: SHARD_OPTIMIZER is stage 1 (optimizer
// state), SHARD_GRAD_OP stage 2 (and gradients), FULL_SHARD stage 3 (and parameters).
enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER, NO_SHARD };
enum class AutoWrapPolicy { TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP };
enum class BackwardPrefetch { BACKWARD_PRE, NO_PREFETCH };
enum class StateDictType { SHARDED_STATE_DICT, FULL_STATE_DICT };

const char* sharding_strategy_name(ShardingStrategy s);
// Parses a strategy name ("FULL_SHARD", ...; case-insensitive). Numbers are refused with the
// map from DeepSpeed stages to names, since Accelerate's numbers (1 = FULL_SHARD) clash with them.
ShardingStrategy parse_sharding_strategy(const std::string& name);

struct FSDPMixedPrecision {
  // The dtype of the compute copy of the parameters (f32, bf16 or f16). Unset means f32.
  // FULL_SHARD casts each shard to it before the all-gather, so the gathered parameters,
  // their per-parameter gradients and the gather traffic are in it; the master shards, the
  // optimizer and the reduction (reduce_dtype) stay in theirs. The replicated strategies
  // accept only f32 and compute in bf16/f16 under autocast (the Accelerator's mixed_precision).
  std::optional<DType> param_dtype;
  // The dtype gradients travel and are averaged in; f32 by default (bf16 reductions have been
  // reported to destabilise training at scale). Shard gradients and master shards are f32.
  DType reduce_dtype = DType::f32;
};

struct FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  AutoWrapPolicy auto_wrap_policy = AutoWrapPolicy::TRANSFORMER_BASED_WRAP;
  // TRANSFORMER_BASED_WRAP: every module whose type_name() is listed becomes a unit.
  std::vector<std::string> transformer_layer_cls_to_wrap;
  // SIZE_BASED_WRAP: bottom-up, a module whose parameters not already in a unit reach this
  // count becomes a unit.
  int64_t min_num_params = 100'000'000;
  // Unset: true for every unit but the root.
  std::optional<bool> reshard_after_forward;
  bool forward_prefetch = true;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  FSDPMixedPrecision mixed_precision;
  bool activation_checkpointing = false;
  StateDictType state_dict_type = StateDictType::SHARDED_STATE_DICT;
  bool cpu_offload = false;
};

}  // namespace ember::distributed
