// Field-by-field comparison of two FSDPOptions (the struct has no operator==), for the tests of
// the places that carry them as text: the environment, the launch config, the Accelerator.
#pragma once
#include <gtest/gtest.h>

#include "distributed/fsdp_options.h"

namespace ember::testing {

inline void expect_same_fsdp_options(const distributed::FSDPOptions& got, const distributed::FSDPOptions& want) {
  EXPECT_EQ(got.sharding_strategy, want.sharding_strategy);
  EXPECT_EQ(got.auto_wrap_policy, want.auto_wrap_policy);
  EXPECT_EQ(got.transformer_layer_cls_to_wrap, want.transformer_layer_cls_to_wrap);
  EXPECT_EQ(got.min_num_params, want.min_num_params);
  EXPECT_EQ(got.reshard_after_forward, want.reshard_after_forward);
  EXPECT_EQ(got.forward_prefetch, want.forward_prefetch);
  EXPECT_EQ(got.backward_prefetch, want.backward_prefetch);
  EXPECT_EQ(got.mixed_precision.param_dtype, want.mixed_precision.param_dtype);
  EXPECT_EQ(got.mixed_precision.reduce_dtype, want.mixed_precision.reduce_dtype);
  EXPECT_EQ(got.activation_checkpointing, want.activation_checkpointing);
  EXPECT_EQ(got.state_dict_type, want.state_dict_type);
  EXPECT_EQ(got.cpu_offload, want.cpu_offload);
}

}  // namespace ember::testing
