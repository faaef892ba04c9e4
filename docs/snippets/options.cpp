// Accelerator(...) options next to Accelerate's constructor arguments and kwargs handlers
// (docs/accelerate_mapping.md). Options are designated initialisers of AcceleratorOptions, in
// the order the struct declares them (accelerate/accelerator.h lists it; out of order, they do
// not compile). The program builds each set and prints a summary.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <chrono>
#include <cstdio>

using namespace ember;

int main() {
  // [options]
  // Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4, cpu=True)
  AcceleratorOptions basics{.mixed_precision = "bf16", .gradient_accumulation_steps = 4, .cpu = true};
  // DataLoaderConfiguration(split_batches=True, even_batches=False)
  AcceleratorOptions loaders{.split_batches = true, .even_batches = false};
  // Accelerator(step_scheduler_with_optimizer=False)
  AcceleratorOptions manual_schedule{.step_scheduler_with_optimizer = false};
  // ProjectConfiguration(project_dir="runs/x", automatic_checkpoint_naming=True, total_limit=3)
  AcceleratorOptions project{.project_dir = "runs/x", .total_limit = 3};
  // DistributedDataParallelKwargs(bucket_cap_mb=4, find_unused_parameters=True)
  AcceleratorOptions ddp{.ddp = {.bucket_cap_mb = 4.0, .find_unused_parameters = true}};
  // GradScalerKwargs(init_scale=1024, growth_interval=500)
  AcceleratorOptions scaler{.mixed_precision = "fp16", .scaler = {.init_scale = 1024.0, .growth_interval = 500}};
  // InitProcessGroupKwargs(timeout=timedelta(minutes=2))
  AcceleratorOptions timeout{.timeout = std::chrono::minutes(2)};
  // set_seed(0) at construction; stop at the first non-finite loss
  AcceleratorOptions careful{.seed = 0, .check_finite_loss = "error"};
  // AutocastKwargs(enabled=False): a prepared model's forward does not autocast by itself
  AcceleratorOptions manual_autocast{.mixed_precision = "bf16", .autocast_prepared_model = false};
  // [/options]

  // [construct]
  Accelerator acc(basics);
  acc.print("mixed precision", acc.mixed_precision(), "| accumulation", acc.gradient_accumulation_steps(),
            "| device", acc.device(), "|", acc.distributed_type());
  // [/construct]
  for (const AcceleratorOptions* o : {&loaders, &manual_schedule, &project, &ddp, &scaler, &timeout, &careful,
                                      &manual_autocast})
    acc.print("split_batches", o->split_batches, "| even_batches", o->even_batches, "| project_dir '" + o->project_dir + "'",
              "| total_limit", o->total_limit, "| bucket_cap_mb", o->ddp.bucket_cap_mb);
  return 0;
}
