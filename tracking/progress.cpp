#include "tracking/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace ember {

namespace {

std::optional<std::string> read_env(const ProgressIO& io, const std::string& name) {
  if (io.getenv) return io.getenv(name);
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

// `ember launch` numbers the ranks of one machine 0.. in LOCAL_RANK; a process started without
// it is the only one and so the main one.
bool is_local_main_process(const ProgressIO& io) {
  const auto local_rank = read_env(io, "LOCAL_RANK");
  if (!local_rank || local_rank->empty()) return true;
  return local_rank->find_first_not_of('0') == std::string::npos;
}

std::optional<ProgressMode> mode_from_environment(const ProgressIO& io) {
  const auto value = read_env(io, "EMBER_PROGRESS");
  if (!value || value->empty() || *value == "auto") return std::nullopt;
  if (*value == "bar" || *value == "tty") return ProgressMode::Bar;
  if (*value == "lines") return ProgressMode::Lines;
  if (*value == "off") return ProgressMode::Off;
  EMBER_FAIL("progress: EMBER_PROGRESS='", *value, "' is not one of auto, bar, tty, lines, off");
}

}  // namespace

ProgressMode resolve_progress_mode(const ProgressOptions& options) {
  const ProgressIO& io = options.io;
  if (!options.all_ranks && !is_local_main_process(io)) return ProgressMode::Off;
  if (options.mode != ProgressMode::Auto) return options.mode;
  if (auto from_env = mode_from_environment(io)) return *from_env;
  const bool terminal = io.terminal ? *io.terminal : isatty(STDERR_FILENO) != 0;
  return terminal ? ProgressMode::Bar : ProgressMode::Lines;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const long long t = (long long)(seconds + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", t / 60, t % 60);
  }
  return buf;
}

std::string format_rate(double per_second, const std::string& unit) {
  char buf[64];
  if (!(per_second > 0) || per_second > 1e15) {
    std::snprintf(buf, sizeof buf, "? %s/s", unit.c_str());
  } else if (per_second < 1) {
    // Slow steps read better as the time one takes.
    const double s = 1 / per_second;
    std::snprintf(buf, sizeof buf, s < 100 ? "%.1f s/%s" : "%.0f s/%s", s, unit.c_str());
  } else {
    const char* format = per_second < 10 ? "%.2f %s/s" : per_second < 100 ? "%.1f %s/s" : "%.0f %s/s";
    std::snprintf(buf, sizeof buf, format, per_second, unit.c_str());
  }
  return buf;
}

namespace {
ProgressOptions with_unit(std::string unit) {
  ProgressOptions options;
  options.unit = std::move(unit);
  return options;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : ProgressBar(std::move(label), total, with_unit(std::move(unit))) {}

ProgressBar::ProgressBar(std::string label, int64_t total, ProgressOptions options)
    : label_(std::move(label)), total_(total), options_(std::move(options)), mode_(resolve_progress_mode(options_)) {
  start_ = last_draw_ = now();
}

ProgressBar::~ProgressBar() {
  if (finished_) return;
  try {
    finish();
  } catch (...) {
    // A failing output stream must not turn into a second exception during unwinding.
  }
}

double ProgressBar::now() const {
  if (options_.io.now_seconds) return options_.io.now_seconds();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ProgressBar::elapsed_seconds() const { return now() - start_; }

void ProgressBar::update(int64_t step, const std::string& postfix) {
  step_ = step;
  postfix_ = postfix;
  if (mode_ == ProgressMode::Off || finished_) return;
  // The last step is drawn by finish(), so it appears once.
  if (total_ > 0 && step >= total_) return;
  const double t = now();
  const double interval = mode_ == ProgressMode::Bar ? options_.redraw_interval_s : options_.line_interval_s;
  if (t - last_draw_ >= interval) {
    last_draw_ = t;
    draw(false);
  }
}

void ProgressBar::finish(const std::string& postfix) {
  if (finished_) return;
  if (!postfix.empty()) postfix_ = postfix;
  finished_ = true;
  if (mode_ != ProgressMode::Off) draw(true);
}

std::string ProgressBar::line(bool final) const {
  const double elapsed = elapsed_seconds();
  const double rate = elapsed > 0 ? double(step_) / elapsed : 0.0;
  const std::string& unit = options_.unit;
  std::string text = label_ + " ";
  if (total_ > 0) {
    const double fraction = std::clamp(double(step_) / double(total_), 0.0, 1.0);
    if (mode_ == ProgressMode::Bar) {
      constexpr int kWidth = 24;
      const int filled = int(fraction * kWidth);
      text += '[';
      text.append(size_t(filled), '#').append(size_t(kWidth - filled), '.');
      text += "] ";
    }
    // After finish() nothing is left to wait for, whatever step the loop stopped at.
    const double eta = final ? 0.0 : rate > 0 ? double(total_ - step_) / rate : -1.0;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%lld/%lld %s %d%% ", (long long)step_, (long long)total_, unit.c_str(),
                  int(fraction * 100));
    text += buf;
    text += format_rate(rate, unit) + " elapsed " + format_duration(elapsed) + " eta " + format_duration(eta);
  } else {
    text += std::to_string(step_) + " " + unit + " " + format_rate(rate, unit) + " elapsed " + format_duration(elapsed);
  }
  if (!postfix_.empty()) text += " | " + postfix_;
  return text;
}

void ProgressBar::draw(bool final) {
  if (mode_ == ProgressMode::Bar) {
    // Back to the line start, erase it, redraw; the final state stays as a complete line.
    shown_ = line(final);
    write("\r\033[K" + shown_ + (final ? "\n" : ""));
    if (final) shown_.clear();
  } else {
    write(line(final) + "\n");
  }
}

void ProgressBar::print(const std::string& text) {
  const bool over_bar = mode_ == ProgressMode::Bar && !shown_.empty();
  if (over_bar) write("\r\033[K");
  if (options_.io.print) {
    options_.io.print(text + "\n");
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (over_bar) write("\r\033[K" + shown_);
}

void ProgressBar::write(const std::string& text) const {
  if (options_.io.write) {
    options_.io.write(text);
  } else {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace ember
