// Progress reporting for long runs: a redrawn bar with rate and ETA on a terminal, plain
// periodic lines otherwise (logs, CI).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace ember {

class ProgressBar {
 public:
  // total <= 0: unknown length (no ETA). unit names what a step counts ("step", "batch").
  ProgressBar(std::string label, int64_t total, std::string unit = "step");
  ~ProgressBar();
  // Advances to `step` (absolute) and shows `postfix` (e.g. "loss 2.31 | 5,120 tok/s").
  void update(int64_t step, const std::string& postfix = "");
  void finish(const std::string& postfix = "");
  double elapsed_seconds() const;

 private:
  void draw(bool final);
  std::string label_, unit_, postfix_;
  int64_t total_, step_ = 0;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace ember
