// Sharded data parallel through the environment, as `ember launch --use_fsdp` hands it to every
// rank (Accelerate's ACCELERATE_USE_FSDP and FSDP_* variables, EMBER_ in front):
//
//   EMBER_USE_FSDP                        true|false|1|0; unset or false: no sharding
//   EMBER_FSDP_SHARDING_STRATEGY          FULL_SHARD|SHARD_GRAD_OP|SHARD_OPTIMIZER|NO_SHARD (names only)
//   EMBER_FSDP_AUTO_WRAP_POLICY           TRANSFORMER_BASED_WRAP|SIZE_BASED_WRAP|NO_WRAP
//   EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP    BertLayer,OtherLayer
//   EMBER_FSDP_MIN_NUM_PARAMS             a positive integer
//   EMBER_FSDP_RESHARD_AFTER_FORWARD      true|false
//   EMBER_FSDP_FORWARD_PREFETCH           true|false
//   EMBER_FSDP_BACKWARD_PREFETCH          BACKWARD_PRE|NO_PREFETCH
//   EMBER_FSDP_ACTIVATION_CHECKPOINTING   true|false
//   EMBER_FSDP_STATE_DICT_TYPE            SHARDED_STATE_DICT|FULL_STATE_DICT
//   EMBER_FSDP_REDUCE_DTYPE               f32|bf16|f16
//   EMBER_FSDP_PARAM_DTYPE                f32|bf16|f16 (FULL_SHARD only)
//   EMBER_FSDP_OFFLOAD_PARAMS             false (true is refused: not supported yet); also
//                                         read as EMBER_FSDP_CPU_OFFLOAD
//
// An unset or empty variable keeps the FSDPOptions default.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/fsdp_options.h"

namespace ember::distributed {

// The options the variables describe; nullopt when EMBER_USE_FSDP is unset or false. A bad
// value is an ember::Error naming the variable, the value and the accepted values.
std::optional<FSDPOptions> fsdp_options_from_env();

// The variables that make fsdp_options_from_env() return `options`: EMBER_USE_FSDP=true and
// one EMBER_FSDP_* per field not left to its default.
std::vector<std::pair<std::string, std::string>> fsdp_env(const FSDPOptions& options);

}  // namespace ember::distributed
