// Google Benchmark's own display (the console table, or what --benchmark_format asks for) with
// a ProgressBar counting the finished cases under it. The display writes into a buffer whose
// complete lines go out through ProgressBar::print, so the table and a redrawn bar do not mix.
// Google Benchmark does not tell how many cases will run before they run, so the bar has no
// total: a count, a rate and the elapsed time, no ETA.
#pragma once
#include <benchmark/benchmark.h>

#include <sstream>
#include <string>
#include <vector>

#include "tracking/progress.h"

namespace bench {

class ProgressReporter : public benchmark::BenchmarkReporter {
 public:
  explicit ProgressReporter(const std::string& label)
      : display_(benchmark::CreateDefaultDisplayReporter()), bar_(label, 0, "case") {
    display_->SetOutputStream(&buffer_);
  }

  bool ReportContext(const Context& context) override {
    const bool ok = display_->ReportContext(context);
    print_complete_lines();
    return ok;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    display_->ReportRuns(runs);
    print_complete_lines();
    if (!runs.empty()) bar_.update(++cases_, runs.back().benchmark_name());
  }

  void Finalize() override {
    display_->Finalize();
    print_complete_lines();
    if (!partial_.empty()) bar_.print(partial_);
    partial_.clear();
    bar_.finish();
  }

 private:
  void print_complete_lines() {
    std::string text = partial_ + buffer_.str();
    buffer_.str("");
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
      bar_.print(text.substr(start, nl - start));
    partial_ = text.substr(start);
  }

  benchmark::BenchmarkReporter* display_;  // owned by Google Benchmark
  std::ostringstream buffer_;
  std::string partial_;
  ember::ProgressBar bar_;
  int64_t cases_ = 0;
};

}  // namespace bench
