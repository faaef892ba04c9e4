// Who am I, ordering, and the collectives, as docs/accelerate_mapping.md lists them. Runs on one
// process or under `ember launch --num_processes N`; every value it checks is computed from N,
// so it prints "collectives agree" and exits 0 on any number of processes.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <cstdio>
#include <string>
#include <vector>

using namespace ember;

int main() {
  Accelerator acc;
  bool ok = true;

  // [who]
  const int rank = acc.process_index();       // 0 .. num_processes() - 1
  const int world = acc.num_processes();
  const int local_rank = acc.local_process_index();
  if (acc.is_main_process()) std::printf("%d processes on %s\n", world, acc.distributed_type().c_str());
  const int local_world = acc.state().local_num_processes();  // AcceleratorState (PartialState)
  if (acc.is_local_main_process()) std::printf("local rank %d of %d on this machine\n", local_rank, local_world);
  Device device = acc.device();                // cpu, or cuda:LOCAL_RANK
  acc.print("Process", rank, "of", world, "on", device);  // once, by the main process: "Process 0 of 2 on cpu"
  // [/who]

  // [order]
  {
    auto first = acc.main_process_first();     // the main process runs this block, then the others
    // e.g. tokenise a dataset and cache it to disk once
  }
  {
    auto first = acc.local_main_process_first();  // once per machine
  }
  acc.wait_for_everyone();                       // a barrier
  // [/order]

  // [on-main-process]
  // Accelerate's @on_main_process / @on_local_main_process / @on_process(k) / @on_last_process
  // decorators: a condition on the call.
  if (acc.is_main_process()) { /* write a report */ }
  if (acc.process_index() == acc.num_processes() - 1) { /* the last process */ }
  // [/on-main-process]

  // [seed]
  acc.set_seed(42);                              // the same stream on every process
  acc.set_seed(42, /*device_specific=*/true);    // seed + process_index()
  // [/seed]

  // [collectives]
  Tensor mine = full({2}, double(rank));                         // [r, r] on process r
  Tensor all = acc.gather(mine);                                 // [0, 0, 1, 1, ...]: 2 * world rows
  Tensor total = acc.reduce(mine, "sum");                        // sum over processes, elementwise
  Tensor mean = acc.reduce(mine, "mean");
  Tensor from_main = acc.broadcast(mine, /*from=*/0);            // process 0's tensor everywhere
  Tensor ragged = arange(rank + 1, TensorOptions{DType::f32});   // 1, 2, ... elements
  Tensor padded = acc.pad_across_processes(ragged, /*dim=*/0, /*pad_index=*/-1);  // world elements each
  const std::string me = "process " + std::to_string(rank);
  std::vector<std::string> names = acc.gather_object(me);            // strings, in rank order
  const std::string text = rank == 0 ? "lr=1e-4" : "";
  std::string config = acc.broadcast_object(text);                   // process 0's string
  // [/collectives]

  // [structures]
  // Tuples, pairs, vectors and Batches (and maps of them) come back as the same structure, in one
  // exchange per dtype instead of one per tensor.
  auto [sum_of_mine, sum_of_twice] = acc.reduce(std::make_tuple(mine, mine * 2.0), "sum");
  std::vector<Tensor> both = acc.gather(std::vector<Tensor>{mine, ragged});  // dim 0 may differ
  Batch sequences;
  sequences["tokens"] = ragged.reshape({1, rank + 1});  // [1, rank + 1]
  sequences["label"] = full({1}, double(rank));
  Batch rectangular = acc.pad_across_processes(sequences, /*dim=*/1);  // "tokens" padded to [1, world]
  Batch from_first = acc.broadcast(rectangular, /*from=*/0);
  // [/structures]

  // [utils]
  // The free functions behind them (accelerate.utils): nullptr for the group means one process.
  Tensor same = distributed::broadcast(mine, acc.process_group(), /*from=*/0);
  Tensor gathered = distributed::gather(mine, acc.process_group());
  // [/utils]

  // [metrics]
  // Evaluation: every sample counted once, although even_batches repeats a few on the last round.
  auto eval_set = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"id", arange(int64_t(10))}});
  data::DataLoader eval_loader(eval_set, {.batch_size = 4});
  auto eval = acc.prepare(eval_loader);
  int64_t seen = 0, id_sum = 0, seen_in_batches = 0;
  for (auto& batch : *eval) {
    Tensor predictions = ge(batch["id"], 5);  // what a model would predict
    auto [ids, predicted] = acc.gather_for_metrics(std::make_tuple(batch["id"], predictions));
    seen += ids.numel();
    id_sum += ids.sum().item<int64_t>();
    Batch everything = acc.gather_for_metrics(batch);  // every field, duplicates dropped likewise
    seen_in_batches += everything["id"].numel() == predicted.numel() ? 0 : 1;
  }
  // [/metrics]

  // [split]
  std::vector<std::string> prompts = {"a", "b", "c", "d", "e"};
  std::vector<std::string> my_prompts = acc.split_between_processes(prompts);  // a contiguous share
  std::vector<std::string> padded_prompts = acc.split_between_processes(prompts, /*apply_padding=*/true);
  // [/split]

  const double w = double(world);
  ok = ok && all.numel() == 2 * world && all.sum().item<double>() == w * (w - 1.0);
  ok = ok && total.to_vector<float>()[0] == float(w * (w - 1.0) / 2.0);
  ok = ok && mean.to_vector<float>()[0] == float((w - 1.0) / 2.0);
  ok = ok && from_main.sum().item<double>() == 0.0 && same.sum().item<double>() == 0.0;
  ok = ok && padded.numel() == world && gathered.numel() == 2 * world;
  ok = ok && int(names.size()) == world && names[0] == "process 0" && config == "lr=1e-4";
  ok = ok && seen == 10 && id_sum == 45 && seen_in_batches == 0;
  ok = ok && sum_of_twice.to_vector<float>()[0] == 2 * sum_of_mine.to_vector<float>()[0];
  ok = ok && sum_of_mine.to_vector<float>()[0] == float(w * (w - 1.0) / 2.0);
  ok = ok && both.size() == 2 && both[0].numel() == 2 * world && both[1].numel() == world * (world + 1) / 2;
  ok = ok && rectangular["tokens"].size(1) == world && rectangular["label"].numel() == 1;
  ok = ok && from_first["label"].item<float>() == 0.0f && from_first["tokens"].size(1) == world;
  ok = ok && padded_prompts.size() == size_t((5 + world - 1) / world) && !my_prompts.empty();
  acc.print(ok ? "collectives agree" : "FAILED");
  return ok ? 0 : 1;
}
