// libFuzzer target: a run's metrics.jsonl (what `ember plot` and end_training's report read) on
// arbitrary bytes, then the whole report drawn from what was read, so the axis and chart code
// sees hostile numbers (huge, tiny, repeated, non-finite). Only ember::Error may escape.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tracking/plot/html_report.h"
#include "tracking/plot/run_metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::plot;
  try {
    RunMetrics run;
    run.name = "fuzz";
    parse_metrics_jsonl(std::string(reinterpret_cast<const char*>(data), size), "metrics.jsonl", run);
    (void)render_html_report({run});
  } catch (const ember::Error&) {
  }
  return 0;
}
