// Typed access to JSON object files such as Hugging Face's config.json. Every failure is an
// ember::Error naming the file, the field, and what was expected versus found:
//   config.json: field 'hidden_size' must be an integer, got string
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ember::nn {

// Parses `text` strictly: a syntax error, trailing garbage or a key repeated within one object
// raises ember::Error prefixed with "<source>: ", and so does nesting deeper than 1000 arrays
// and objects (serialising such a value would recurse past the stack).
nlohmann::json parse_json(std::string_view text, const std::string& source);

// "integer", "float", "string", "boolean", "null", "array" or "object".
const char* json_type_name(const nlohmann::json& value);

class JsonConfig {
 public:
  JsonConfig() : JsonConfig(nlohmann::json::object(), "<config>") {}
  // `source` names the file (or other origin) in error messages; `object` must be an object.
  JsonConfig(nlohmann::json object, std::string source);

  // Reads a file whose top level is a JSON object.
  static JsonConfig load(const std::string& path);
  static JsonConfig parse(std::string_view text, std::string source = "<string>");

  const std::string& source() const { return source_; }
  bool contains(const std::string& key) const;
  std::vector<std::string> keys() const;

  // Getters. T is one of: bool, int, int64_t, float, double, std::string,
  // std::vector<int>, std::vector<int64_t>, std::vector<double>, std::vector<std::string>,
  // std::map<std::string, std::string>, std::map<std::string, int64_t>.
  // Integers must be JSON integers that fit T; floats accept any JSON number.
  template <typename T> T get(const std::string& key) const;  // required; null is a type error
  // A missing or null field gives `fallback` (null is how Python writes None).
  template <typename T> T get(const std::string& key, const T& fallback) const {
    auto v = get_optional<T>(key);
    return v ? *v : fallback;
  }
  template <typename T> std::optional<T> get_optional(const std::string& key) const;
  // A nested object; its errors name the field path, e.g. "field 'task.labels.0'".
  JsonConfig get_object(const std::string& key) const;

  // Setters (no file I/O until save()).
  template <typename T> JsonConfig& set(const std::string& key, const T& value) {
    json_[key] = value;
    return *this;
  }
  JsonConfig& set_null(const std::string& key);
  JsonConfig& set_object(const std::string& key, const JsonConfig& value);
  bool erase(const std::string& key);

  const nlohmann::json& json() const { return json_; }
  // Pretty JSON with sorted keys and two-space indent, newline-terminated, like transformers'
  // PretrainedConfig.to_json_string().
  std::string dump() const;
  // Writes dump() to `path` atomically (temporary file, fsync, rename).
  void save(const std::string& path) const;

 private:
  JsonConfig(nlohmann::json object, std::string source, std::string prefix);
  const nlohmann::json& required(const std::string& key) const;
  std::string field(const std::string& key) const { return prefix_ + key; }

  nlohmann::json json_;
  std::string source_;
  std::string prefix_;  // "outer.inner." for nested objects
};

}  // namespace ember::nn
