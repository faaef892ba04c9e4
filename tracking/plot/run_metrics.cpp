// Reading a run directory: metrics.jsonl line by line, config.json as a whole. Values are kept
// per (metric, step) in ordered maps while reading, so a repeated step simply overwrites and
// the series come out sorted by step whatever order the lines were appended in.
#include "tracking/plot/run_metrics.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ember::plot {

namespace fs = std::filesystem;
// ordered_json keeps keys in file order, which fixes the metrics' first-seen order.
using Json = nlohmann::ordered_json;

namespace {

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in, "plot: cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  EMBER_CHECK(!in.bad(), "plot: cannot read ", path);
  return ss.str();
}

// A parse error at the very end of the text means the text stopped early: the writer was
// killed mid-line. An error before the end is a malformed line.
bool stops_early(const nlohmann::json::parse_error& e, const std::string& line) {
  return e.byte >= line.size();
}

}  // namespace

const MetricSeries* RunMetrics::find(const std::string& metric) const {
  for (const MetricSeries& series : metrics)
    if (series.name == metric) return &series;
  return nullptr;
}

void parse_metrics_jsonl(const std::string& text, const std::string& file, RunMetrics& run) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int64_t, double>> values;  // metric -> step -> value

  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  size_t last_content = lines.size();
  for (size_t i = lines.size(); i-- > 0;)
    if (lines[i].find_first_not_of(" \t") != std::string::npos) {
      last_content = i;
      break;
    }

  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(i + 1);
    Json record;
    try {
      record = Json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      if (i == last_content && stops_early(e, line)) {
        run.warnings.push_back(where + ": skipped the last line, which is cut short (" +
                               std::to_string(line.size()) + " bytes; was the run killed?)");
        continue;
      }
      EMBER_FAIL("plot: ", where, ": not a JSON object: ", e.what());
    } catch (const nlohmann::json::exception& e) {  // a number too large for a double
      EMBER_FAIL("plot: ", where, ": ", e.what());
    }
    EMBER_CHECK(record.is_object(), "plot: ", where, ": expected a JSON object, got ", record.type_name());
    const auto step_it = record.find("step");
    EMBER_CHECK(step_it != record.end(), "plot: ", where, ": no \"step\"");
    EMBER_CHECK(step_it->is_number_integer() &&
                    !(step_it->is_number_unsigned() &&
                      step_it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())),
                "plot: ", where, ": \"step\" must be an integer, got ", step_it->dump());
    const int64_t step = step_it->get<int64_t>();
    const auto time_it = record.find("wall_time");
    EMBER_CHECK(time_it != record.end() && time_it->is_number(), "plot: ", where,
                ": \"wall_time\" must be a number (seconds since the epoch)",
                time_it == record.end() ? std::string(", but it is missing") : ", got " + time_it->dump());

    for (const auto& [key, value] : record.items()) {
      if (key == "step" || key == "wall_time") continue;
      EMBER_CHECK(value.is_number() || value.is_null(), "plot: ", where, ": \"", key,
                  "\" must be a number or null, got ", value.dump());
      auto [it, inserted] = values.try_emplace(key);
      if (inserted) order.push_back(key);
      it->second[step] = value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>();
    }
  }

  for (const std::string& name : order) {
    MetricSeries series;
    series.name = name;
    for (const auto& [step, value] : values[name]) {
      series.steps.push_back(step);
      series.values.push_back(value);
    }
    run.metrics.push_back(std::move(series));
  }
}

bool is_run_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "metrics.jsonl", ec);
}

RunMetrics read_run(const std::string& dir) {
  RunMetrics run;
  run.dir = dir;
  run.name = fs::path(dir).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  const std::string metrics_file = (fs::path(dir) / "metrics.jsonl").string();
  EMBER_CHECK(is_run_dir(dir), "plot: ", dir, " has no metrics.jsonl");
  parse_metrics_jsonl(read_whole_file(metrics_file), metrics_file, run);

  const std::string config_file = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (fs::exists(config_file, ec)) {
    Json config;
    try {
      config = Json::parse(read_whole_file(config_file));
    } catch (const nlohmann::json::parse_error& e) {
      EMBER_FAIL("plot: ", config_file, ": not valid JSON: ", e.what());
    } catch (const nlohmann::json::exception& e) {
      EMBER_FAIL("plot: ", config_file, ": ", e.what());
    }
    EMBER_CHECK(config.is_object(), "plot: ", config_file, ": expected a JSON object, got ", config.type_name());
    for (const auto& [key, value] : config.items())
      run.config.emplace_back(key, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return run;
}

std::vector<std::string> expand_run_dirs(const std::vector<std::string>& paths) {
  std::vector<std::string> runs;
  for (const std::string& path : paths) {
    std::error_code ec;
    EMBER_CHECK(fs::is_directory(path, ec), "plot: ", path, " is not a directory");
    if (is_run_dir(path)) {
      runs.push_back(path);
      continue;
    }
    std::set<std::string> children;  // sorted by name
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.is_directory() && is_run_dir(entry.path().string())) children.insert(entry.path().string());
    EMBER_CHECK(!ec, "plot: cannot list ", path, ": ", ec.message());
    EMBER_CHECK(!children.empty(), "plot: ", path,
                " has no metrics.jsonl, and no subdirectory of it has one (is it a run directory?)");
    runs.insert(runs.end(), children.begin(), children.end());
  }
  std::error_code ec;
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      EMBER_CHECK(fs::weakly_canonical(runs[i], ec) != fs::weakly_canonical(runs[j], ec), "plot: the run ",
                  runs[i], " is named twice");
  return runs;
}

std::vector<RunMetrics> read_runs(const std::vector<std::string>& paths) {
  std::vector<RunMetrics> runs;
  for (const std::string& dir : expand_run_dirs(paths)) runs.push_back(read_run(dir));
  std::map<std::string, int> uses;
  for (const RunMetrics& run : runs) ++uses[run.name];
  for (RunMetrics& run : runs)
    if (uses[run.name] > 1) {
      const fs::path parent = fs::weakly_canonical(run.dir).parent_path();
      run.name = parent.filename().string() + "/" + run.name;
    }
  return runs;
}

}  // namespace ember::plot
