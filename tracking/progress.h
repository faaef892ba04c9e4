// Progress reporting for long runs: a redrawn bar with rate and ETA on a terminal, plain
// periodic lines otherwise (logs, CI), nothing on the processes that are not the local main one.
//
// How a bar decides what to draw (first rule that applies):
//  1. Not the local main process (LOCAL_RANK set and not 0, as `ember launch` sets it for every
//     rank): silent, like Accelerate's `disable=not accelerator.is_local_main_process`.
//     ProgressOptions::all_ranks = true draws on every process.
//  2. ProgressOptions::mode other than Auto: that mode, whatever the environment says.
//  3. EMBER_PROGRESS in the environment:
//       bar    redrawn in place ("\r" + the line), ~10 times a second
//       tty    the same; `ember launch` sets it for local rank 0 when its own stderr is a
//              terminal and EMBER_PROGRESS is unset (the ranks write into pipes, so they cannot
//              see the terminal themselves; the launcher redraws the bar behind "[rank 0] ")
//       lines  one complete line every ProgressOptions::line_interval_s seconds
//       off    nothing at all
//       auto or empty: rule 4. Any other value is an error.
//  4. A bar when stderr is a terminal, else lines.
//
// Every mode but off ends with one complete final line (finish(), or the destructor). A line
// reads, with the bar only in bar mode:
//   pretrain [######..................] 120/500 step 24% 3.41 step/s elapsed 00:35 eta 01:51 | loss 2.31
// and with an unknown total (no percentage, no ETA):
//   eval 120 batch 3.41 batch/s elapsed 00:35 | loss 2.31
// Rates below one per second read as seconds per unit ("12.5 s/step"). The bar goes to stderr;
// a loop's own report lines go through print() to stdout, on every process.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace ember {

enum class ProgressMode { Auto, Bar, Lines, Off };

// What a bar takes from the outside world. Empty members mean the real thing (stderr, stdout,
// the steady clock, isatty(stderr), getenv); tests put their own in.
struct ProgressIO {
  std::function<void(const std::string&)> write;  // the bar's own output
  std::function<void(const std::string&)> print;  // the program's lines, see ProgressBar::print
  std::function<double()> now_seconds;
  std::optional<bool> terminal;
  std::function<std::optional<std::string>(const std::string&)> getenv;
};

struct ProgressOptions {
  std::string unit = "step";          // what a step counts: "step", "batch", "case"
  ProgressMode mode = ProgressMode::Auto;
  bool all_ranks = false;             // draw on every process, not only local rank 0
  double line_interval_s = 10.0;      // lines mode: seconds between lines
  double redraw_interval_s = 0.1;     // bar mode: seconds between redraws
  ProgressIO io;
};

// The mode a bar with these options runs in (the rules above).
ProgressMode resolve_progress_mode(const ProgressOptions& options);

// "05:07", "1:02:03"; "?" for a negative or absurd duration.
std::string format_duration(double seconds);
// "3.41 step/s", "250 case/s", "12.5 s/step"; "? step/s" for a rate not yet known.
std::string format_rate(double per_second, const std::string& unit);

class ProgressBar {
 public:
  // total <= 0: unknown length (no percentage, no ETA). unit names what a step counts.
  ProgressBar(std::string label, int64_t total, std::string unit = "step");
  ProgressBar(std::string label, int64_t total, ProgressOptions options);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Advances to `step` (absolute) and shows `postfix` (e.g. "loss 2.31 | 5,120 tok/s").
  void update(int64_t step, const std::string& postfix = "");
  // Draws the final line (step as last given to update()); later calls do nothing.
  void finish(const std::string& postfix = "");
  // Prints `line` and a newline on stdout, above a bar being redrawn (which is erased first and
  // drawn again after), so that a loop's own reports do not land in the middle of the bar.
  // Prints in every mode, off included: which process reports is the program's choice.
  void print(const std::string& line);
  double elapsed_seconds() const;
  ProgressMode mode() const { return mode_; }
  // The text of the line for the current state, without "\r" or newline.
  std::string line(bool final) const;

 private:
  double now() const;
  void draw(bool final);
  void write(const std::string& text) const;

  std::string shown_;  // bar mode: what is on the terminal now, "" when nothing is

  std::string label_, postfix_;
  int64_t total_, step_ = 0;
  ProgressOptions options_;
  ProgressMode mode_;
  bool finished_ = false;
  double start_, last_draw_;
};

}  // namespace ember
