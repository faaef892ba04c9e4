#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ember {

namespace {
std::string hms(double s) {
  if (s < 0 || s > 1e7) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  }
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!finished_) finish();
}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::update(int64_t step, const std::string& postfix) {
  step_ = step;
  postfix_ = postfix;
  const auto now = std::chrono::steady_clock::now();
  // Terminals redraw ~10 times a second; logs get a line every 10 seconds.
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  // The last step is drawn by finish(), so it appears once.
  if (since >= (tty_ ? 0.1 : 10.0) && !(total_ > 0 && step >= total_)) {
    last_draw_ = now;
    draw(false);
  }
}

void ProgressBar::finish(const std::string& postfix) {
  if (!postfix.empty()) postfix_ = postfix;
  finished_ = true;
  draw(true);
}

void ProgressBar::draw(bool final) {
  const double el = elapsed_seconds();
  const double rate = el > 0 ? double(step_) / el : 0.0;
  std::string line = label_ + " ";
  char buf[160];
  if (total_ > 0) {
    const double frac = std::min(1.0, double(step_) / double(total_));
    if (tty_) {
      const int width = 24, filled = int(frac * width);
      line += "[" + std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.') + "] ";
    }
    const double eta = rate > 0 ? double(total_ - step_) / rate : -1;
    std::snprintf(buf, sizeof buf, "%lld/%lld %s (%3.0f%%) %.2f %s/s elapsed %s eta %s", (long long)step_,
                  (long long)total_, unit_.c_str(), frac * 100, rate, unit_.c_str(), hms(el).c_str(),
                  final ? "00:00" : hms(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%lld %s %.2f %s/s elapsed %s", (long long)step_, unit_.c_str(), rate,
                  unit_.c_str(), hms(el).c_str());
  }
  line += buf;
  if (!postfix_.empty()) line += " | " + postfix_;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace ember
