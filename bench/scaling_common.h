// What bench/ddp_scaling.cpp and bench/fsdp_scaling.cpp share: the command-line flags of a
// weak-scaling run, the timed loop over BertBenchModel::train_step, and the job's step times
// (the slowest rank per step).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bert_bench_model.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "tracking/progress.h"

namespace ember::bench {

// The flags both programs take: model size, per-rank batch, steps, threads and seed.
struct ScalingArgs : BertSizes {
  int64_t batch = 16, warmup = 3, steps = 10;
  int threads = 1;
  uint64_t seed = 0;
};

// Reads flag `k` with value `v` into `a` when it is one of ScalingArgs' flags (--config, --batch,
// --seq, --warmup, --steps, --threads, --seed); returns false for any other flag.
inline bool parse_scaling_flag(ScalingArgs& a, const std::string& k, const std::string& v, const std::string& program) {
  if (k == "--config") apply_bert_preset(a, v, program);
  else if (k == "--batch") a.batch = std::stoll(v);
  else if (k == "--seq") a.seq = std::stoll(v);
  else if (k == "--warmup") a.warmup = std::stoll(v);
  else if (k == "--steps") a.steps = std::stoll(v);
  else if (k == "--threads") a.threads = std::stoi(v);
  else if (k == "--seed") a.seed = std::stoull(v);
  else return false;
  return true;
}

// Parses `--flag value` pairs into `a`: ScalingArgs' own flags, then `extra(flag, value)` for the
// program's (false: unknown flag, an error). --help prints `usage` and exits.
inline void parse_scaling_args(int argc, char** argv, ScalingArgs& a, const std::string& program, const char* usage,
                               const std::function<bool(const std::string&, const std::string&)>& extra) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help") {
      std::printf("%s", usage);
      std::exit(0);
    }
    EMBER_CHECK(i + 1 < argc, program, ": ", k, " needs a value");
    const std::string v = argv[++i];
    if (!parse_scaling_flag(a, k, v, program) && !extra(k, v)) EMBER_FAIL(program, ": unknown option ", k);
  }
  EMBER_CHECK(a.steps > 0 && a.warmup >= 0, program, ": --steps must be positive, --warmup non-negative");
  EMBER_CHECK(a.batch > 0 && a.seq > 0 && a.threads > 0, program, ": --batch, --seq and --threads must be positive");
}

// This rank's place in the job (`ember launch`'s environment) and, with more than one rank, its
// Gloo group (null for one process).
struct ScalingRank {
  distributed::RendezvousInfo info;
  std::shared_ptr<distributed::ProcessGroup> pg;
};

// Sets the thread count and seeds the initial weights (the same on every rank; the wrappers
// broadcast rank 0's anyway), then joins the job. Collective when there are several ranks.
inline ScalingRank join_job(const ScalingArgs& a) {
  ScalingRank r{distributed::rendezvous_info_from_env(), nullptr};
  set_num_threads(a.threads);
  manual_seed(a.seed);
  if (r.info.world_size > 1) {
    auto store = distributed::rendezvous(r.info, std::chrono::seconds(60));
    r.pg = distributed::new_process_group(store, r.info.rank, r.info.world_size, "gloo");
  }
  return r;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs warmup + steps optimiser steps and returns the timed steps' wall times in ms. When the
// warm-up ends, `pg` (if any) is barriered and `at_timing_start` (if any) runs: counters reset
// there cover the timed steps only. The bar is drawn by local rank 0 only.
inline std::vector<double> timed_steps(BertBenchModel& model, optim::AdamW& opt, const ScalingArgs& a,
                                       const std::string& label, distributed::ProcessGroup* pg,
                                       const std::function<void()>& at_timing_start = {}) {
  std::vector<double> times;
  ProgressBar bar(label, a.warmup + a.steps);
  for (int64_t it = 0; it < a.warmup + a.steps; ++it) {
    if (it == a.warmup) {
      if (pg) pg->barrier();
      if (at_timing_start) at_timing_start();
    }
    const double ms = model.train_step(opt, a.batch, a.seq, a.vocab);
    if (it >= a.warmup) times.push_back(ms);
    char post[64];
    std::snprintf(post, sizeof post, "%.0f tok/s per rank", double(a.batch * a.seq) / (ms / 1000.0));
    bar.update(it + 1, post);
  }
  bar.finish();
  return times;
}

// The job moves at the pace of its slowest rank: the per-step maximum over ranks (collective).
inline std::vector<double> slowest_rank_times(distributed::ProcessGroup* pg, std::vector<double> times) {
  if (!pg) return times;
  Tensor t = from_vector(times, {int64_t(times.size())});
  pg->allreduce(t, distributed::ReduceOp::Max)->wait();
  return t.to_vector<double>();
}

}  // namespace ember::bench
