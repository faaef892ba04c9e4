// The experiment-tracking vocabulary shared by Accelerator::init_trackers/log and the trackers
// behind it (Hugging Face Accelerate's GeneralTracker):
//   TrackerValue   one hyperparameter: bool, integer, floating point or string. One constructor
//                  per kind, so {{"lr", 2e-5}, {"batch_size", 32}, {"model", "bert"}, {"bf16", true}}
//                  picks the intended kind with no ambiguity (a string literal is a string, not
//                  a bool).
//   TrackerConfig  the hyperparameters of a run, by name.
//   LogValues      the scalars of one log() call, in the order given.
//   Tracker        one output format (JSON lines, TensorBoard); writes into the run directory.
#pragma once
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace ember::tracking {

class TrackerValue {
 public:
  using Variant = std::variant<bool, int64_t, double, std::string>;

  TrackerValue(bool value) : value_(value) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  TrackerValue(T value) : value_(to_int64(value)) {}
  template <std::floating_point T>
  TrackerValue(T value) : value_(static_cast<double>(value)) {}
  TrackerValue(const char* value) : value_(std::string(value)) {}
  TrackerValue(std::string value) : value_(std::move(value)) {}

  const Variant& value() const { return value_; }
  // As it reads in a table: true/false, the integer, the shortest round-trip double, the text.
  std::string to_string() const;

  bool operator==(const TrackerValue&) const = default;

 private:
  template <std::integral T>
  static int64_t to_int64(T value) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t))
      EMBER_CHECK(value <= static_cast<T>(INT64_MAX), "TrackerValue: ", value, " does not fit in int64");
    return static_cast<int64_t>(value);
  }

  Variant value_;
};

using TrackerConfig = std::map<std::string, TrackerValue>;

// Scalars by name, in the order given. Built from a braced list, a std::map or a vector of pairs:
//   acc.log({{"loss", loss}, {"lr", lr}}, step);
class LogValues {
 public:
  LogValues() = default;
  LogValues(std::initializer_list<std::pair<std::string, double>> values) : values_(values) {}
  LogValues(std::vector<std::pair<std::string, double>> values) : values_(std::move(values)) {}
  LogValues(const std::map<std::string, double>& values) : values_(values.begin(), values.end()) {}

  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }

 private:
  std::vector<std::pair<std::string, double>> values_;
};

class Tracker {
 public:
  virtual ~Tracker() = default;
  // The name log_with selects it by: "jsonl" or "tensorboard".
  virtual std::string name() const = 0;
  // The file it writes.
  virtual std::string path() const = 0;
  // The run's hyperparameters, once, before the first log().
  virtual void store_init_configuration(const TrackerConfig& config) = 0;
  // One row of scalars at `step`, stamped `wall_time` (seconds since the Unix epoch); reaches the
  // file before returning.
  virtual void log(const LogValues& values, int64_t step, double wall_time) = 0;
  // Flushes and closes; later calls do nothing.
  virtual void finish() = 0;
};

}  // namespace ember::tracking
