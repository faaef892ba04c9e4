// Reads one training run's directory as the experiment tracker writes it: metrics.jsonl (one
// JSON object per logged step: "step", "wall_time" and named scalars, null for a non-finite
// value) and the optional flat config.json. Built for plotting: every metric becomes a series
// sorted by step, a step logged twice keeps its later value (a resumed run appends to the
// file), and a killed run's cut-off last line is skipped with a warning instead of failing.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ember::plot {

// One metric of one run; value is NaN where the run logged null (a non-finite value).
struct MetricSeries {
  std::string name;
  std::vector<int64_t> steps;  // strictly increasing
  std::vector<double> values;
};

struct RunMetrics {
  std::string name;  // the directory's name
  std::string dir;
  std::vector<MetricSeries> metrics;                         // in first-logged order
  std::vector<std::pair<std::string, std::string>> config;   // config.json, in file order
  std::vector<std::string> warnings;                         // lines skipped, with the reason

  // The series named `name`, or nullptr when the run never logged it.
  const MetricSeries* find(const std::string& metric) const;
};

// Parses metrics.jsonl text; `file` names it in messages. A line that is not a JSON object with
// an integer "step", a numeric "wall_time" and numeric-or-null values throws ember::Error
// naming the file and line; only the last line may be cut short (it then lands in warnings).
void parse_metrics_jsonl(const std::string& text, const std::string& file, RunMetrics& run);

// Reads `dir`/metrics.jsonl (required) and `dir`/config.json (optional).
RunMetrics read_run(const std::string& dir);

// True when `dir` holds a metrics.jsonl.
bool is_run_dir(const std::string& dir);

// The run directories named by `paths`: a path holding metrics.jsonl is a run; otherwise every
// subdirectory of it that holds one is (a project directory, its runs sorted by name). A path
// that is neither throws ember::Error.
std::vector<std::string> expand_run_dirs(const std::vector<std::string>& paths);

// read_run over expand_run_dirs(paths). Runs whose directory names collide (a/seed1, b/seed1)
// are named "parent/name" so the legends tell them apart.
std::vector<RunMetrics> read_runs(const std::vector<std::string>& paths);

}  // namespace ember::plot
