// The distributed training API in one include: #include <ember/accelerate.h>
//
//   ember::Accelerator acc({.gradient_accumulation_steps = 4});
//   auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
//   for (auto& batch : *l) {
//     auto guard = acc.accumulate(m);        // a bare `acc.accumulate(m);` does not compile
//     acc.backward(m->forward(batch).loss);  // under mixed precision the call autocasts
//     o->step(); s->step(); o->zero_grad();
//   }
//
// See accelerate/accelerator.h and docs/accelerate_semantics.md.
#pragma once

#include "ember/ember.h"

#include "accelerate/accelerated_dataloader.h"
#include "accelerate/accelerated_model.h"
#include "accelerate/accelerated_optimizer.h"
#include "accelerate/accelerated_scheduler.h"
#include "accelerate/accelerator.h"
#include "accelerate/accelerator_state.h"
#include "accelerate/checkpointing.h"
#include "distributed/ddp.h"
#include "distributed/default_process_group.h"
#include "distributed/operations.h"
#include "distributed/overflow_agreement.h"
#include "distributed/sync_batch_norm.h"

namespace ember {

using distributed::AcceleratedDataLoader;
using distributed::AcceleratedOptimizer;
using distributed::AcceleratedScheduler;
using distributed::Accelerator;
using distributed::PreparedModel;
using distributed::AcceleratorOptions;
using distributed::AcceleratorState;
using distributed::Checkpointable;
using distributed::GradientState;
using distributed::ObjectState;

}  // namespace ember
