// Experiment tracking with the Accelerator (docs/quickstart.md): trackers named in log_with write
// under project_dir/<run name>; `ember plot runs/sst2` turns a run into an HTML report.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <cstdio>
#include <filesystem>

using namespace ember;

int main() {
  // [tracking]
  Accelerator acc({.log_with = {"jsonl", "tensorboard"}, .project_dir = "runs"});
  acc.init_trackers("sst2", {{"lr", 2e-5}, {"batch_size", 32}, {"model", "bert-tiny"}});
  for (int64_t step = 0; step < 100; ++step) {
    const double loss = 1.0 / double(step + 1);
    acc.log({{"loss", loss}, {"lr", 1e-4}}, step);  // main process only, like Accelerate
  }
  [[maybe_unused]] auto&& jsonl = acc.get_tracker("jsonl");  // the tracker itself
  acc.end_training();                              // flushes, closes, writes runs/sst2/report.html
  // [/tracking]
  namespace fs = std::filesystem;
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator("runs/sst2"))
    event_files += entry.path().filename().string().starts_with("events.out.tfevents.");
  std::printf("metrics.jsonl %s, config.json %s, report.html %s, %d event file(s)\n",
              fs::exists("runs/sst2/metrics.jsonl") ? "yes" : "no", fs::exists("runs/sst2/config.json") ? "yes" : "no",
              fs::exists("runs/sst2/report.html") ? "yes" : "no", event_files);
  return 0;
}
