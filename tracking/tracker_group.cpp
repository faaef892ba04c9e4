#include "tracking/tracker_group.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "tracking/jsonl_tracker.h"
#include "tracking/tensorboard_tracker.h"

namespace fs = std::filesystem;

namespace ember::tracking {

namespace {

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

std::unique_ptr<Tracker> make_tracker(const std::string& name, const std::string& run_dir) {
  if (name == "jsonl") return std::make_unique<JsonlTracker>(run_dir);
  if (name == "tensorboard") return std::make_unique<TensorBoardTracker>(run_dir);
  EMBER_FAIL("TrackerGroup: no tracker called '", name, "'");
}

void write_config(const std::string& path, const TrackerConfig& config) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, value] : config)
    std::visit([&, &key = name](const auto& v) { object[key] = v; }, value.value());
  std::ofstream out(path, std::ios::trunc);
  out << object.dump(2) << "\n";
  out.flush();
  EMBER_CHECK(out.good(), "init_trackers: cannot write '", path, "'");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

const std::vector<std::string>& TrackerGroup::known_trackers() {
  static const std::vector<std::string> names = {"jsonl", "tensorboard"};
  return names;
}

TrackerGroup::TrackerGroup(const std::vector<std::string>& log_with) {
  const auto& known = known_trackers();
  std::set<std::string> selected;
  for (const auto& name : log_with) {
    if (name == "all") {
      selected.insert(known.begin(), known.end());
      continue;
    }
    EMBER_CHECK(std::find(known.begin(), known.end(), name) != known.end(), "Accelerator: unknown tracker '", name,
                "' in log_with; known trackers: ", quoted_list(known), " and 'all'");
    selected.insert(name);
  }
  for (const auto& name : known)
    if (selected.count(name)) names_.push_back(name);
}

TrackerGroup::~TrackerGroup() = default;

void TrackerGroup::start(const std::string& project_dir, const std::string& project_name, const TrackerConfig& config,
                         bool write) {
  EMBER_CHECK(!project_name.empty(), "init_trackers: the project name is empty");
  start_in((fs::path(project_dir) / project_name).string(), config, write);
}

void TrackerGroup::start_in(const std::string& run_dir, const TrackerConfig& config, bool write) {
  EMBER_CHECK(!active_, "init_trackers: the run '", run_dir_, "' is still active; call end_training() first");
  EMBER_CHECK(!run_dir.empty(), "init_trackers: the run directory is empty");
  std::vector<std::unique_ptr<Tracker>> trackers;
  if (write && !names_.empty()) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    EMBER_CHECK(!ec, "init_trackers: cannot create the run directory '", run_dir, "': ", ec.message());
    write_config(run_dir + "/config.json", config);
    for (const auto& name : names_) {
      trackers.push_back(make_tracker(name, run_dir));
      trackers.back()->store_init_configuration(config);
    }
  }
  trackers_ = std::move(trackers);
  run_dir_ = run_dir;
  log_calls_ = 0;
  active_ = true;
}

void TrackerGroup::log(const LogValues& values, std::optional<int64_t> step) {
  EMBER_CHECK(active_, "log: no active run; call init_trackers(project_name) first");
  std::set<std::string> seen;
  for (const auto& [name, value] : values) {
    EMBER_CHECK(!name.empty(), "log: a value has an empty name");
    EMBER_CHECK(name != "step" && name != "wall_time", "log: the name '", name,
                "' is reserved (every row has 'step' and 'wall_time'); pass the step as log()'s second argument");
    EMBER_CHECK(seen.insert(name).second, "log: the name '", name, "' appears twice in one call");
  }
  const int64_t at = step.value_or(log_calls_);
  ++log_calls_;
  const double wall_time = now_seconds();
  for (auto& tracker : trackers_) tracker->log(values, at, wall_time);
}

void TrackerGroup::finish() {
  if (!active_) return;
  active_ = false;
  auto trackers = std::move(trackers_);
  trackers_.clear();
  // Every tracker gets closed even when one fails; the first failure is raised afterwards.
  std::exception_ptr first_error;
  for (auto& tracker : trackers) {
    try {
      tracker->finish();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

Tracker* TrackerGroup::get(const std::string& name) const {
  for (const auto& tracker : trackers_)
    if (tracker->name() == name) return tracker.get();
  return nullptr;
}

}  // namespace ember::tracking
