// PowerSGD gradient compression for DistributedDataParallel (Vogels et al., 2019; torch's
// powerSGD_hook): each gradient matrix M (n x m, a weight's first dimension by the rest) is
// sent as two thin factors, P = M Q (n x r) and Q = M^T P (m x r), all-reduced in turn, with P
// orthogonalised in f32 between them; the bucket gets P Q^T. What the approximation leaves
// out is added back the next step (error feedback), so nothing is lost for good. Vectors
// (biases, norms) and matrices too small to gain go plainly. The first start_iter passes
// all-reduce everything plainly. docs/ddp_communication.md section 5.
#pragma once
#include "distributed/comm_hooks.h"

namespace ember::distributed {

// PowerSGDOptions (the rank r, start_iter, error feedback, warm start): comm_hooks.h.
// CPU buckets of f32 gradients; another device or dtype is an ember::Error.
CommHook powersgd_hook(PowerSGDOptions options = {});

}  // namespace ember::distributed
