#include "nn/io/json_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"
#include "nn/io/atomic_file.h"

namespace ember::nn {

using Json = nlohmann::json;

const char* json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "float";
    case Json::value_t::binary: return "binary";
    case Json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

namespace {

// nlohmann's messages start with "[json.exception.parse_error.101] "; users need only the rest.
std::string without_exception_tag(const char* what) {
  std::string s = what;
  const size_t close = s.find("] ");
  return s.rfind("[json.exception.", 0) == 0 && close != std::string::npos ? s.substr(close + 2) : s;
}

std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EMBER_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    EMBER_FAIL("cannot read '", path, "': not a regular file");
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      EMBER_FAIL("error reading '", path, "': ", std::strerror(err));
    }
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  ::close(fd);
  return out;
}

// ---- conversions from a JSON value to each supported C++ type. `field` is the dotted path
// used in messages.
struct Where {
  const std::string& source;
  std::string field;
};

[[noreturn]] void type_error(const Where& at, const char* expected, const Json& v) {
  EMBER_FAIL(at.source, ": field '", at.field, "' must be ", expected, ", got ", json_type_name(v));
}

template <typename T> struct Convert;

template <> struct Convert<int64_t> {
  static int64_t from(const Json& v, const Where& at) {
    if (!v.is_number_integer()) type_error(at, "an integer", v);
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      EMBER_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), at.source, ": field '", at.field,
                  "' = ", u, " does not fit in a 64-bit integer");
      return int64_t(u);
    }
    return v.get<int64_t>();
  }
};

template <> struct Convert<int> {
  static int from(const Json& v, const Where& at) {
    const int64_t x = Convert<int64_t>::from(v, at);
    EMBER_CHECK(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(), at.source,
                ": field '", at.field, "' = ", x, " does not fit in a 32-bit integer");
    return int(x);
  }
};

template <> struct Convert<double> {
  static double from(const Json& v, const Where& at) {
    if (!v.is_number()) type_error(at, "a number", v);
    return v.get<double>();
  }
};

template <> struct Convert<float> {
  static float from(const Json& v, const Where& at) {
    const double d = Convert<double>::from(v, at);
    EMBER_CHECK(!(std::fabs(d) > double(std::numeric_limits<float>::max())), at.source, ": field '",
                at.field, "' = ", d, " does not fit in a 32-bit float");
    return float(d);
  }
};

template <> struct Convert<bool> {
  static bool from(const Json& v, const Where& at) {
    if (!v.is_boolean()) type_error(at, "a boolean", v);
    return v.get<bool>();
  }
};

template <> struct Convert<std::string> {
  static std::string from(const Json& v, const Where& at) {
    if (!v.is_string()) type_error(at, "a string", v);
    return v.get<std::string>();
  }
};

template <typename E> struct Convert<std::vector<E>> {
  static std::vector<E> from(const Json& v, const Where& at) {
    if (!v.is_array()) type_error(at, "an array", v);
    std::vector<E> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(Convert<E>::from(v[i], Where{at.source, at.field + "[" + std::to_string(i) + "]"}));
    return out;
  }
};

template <typename E> struct Convert<std::map<std::string, E>> {
  static std::map<std::string, E> from(const Json& v, const Where& at) {
    if (!v.is_object()) type_error(at, "an object", v);
    std::map<std::string, E> out;
    for (const auto& [k, item] : v.items()) out.emplace(k, Convert<E>::from(item, Where{at.source, at.field + "." + k}));
    return out;
  }
};

// The deepest nesting of arrays and objects parse_json accepts. nlohmann parses iteratively, but
// serialising (dump(), error messages that show a value) recurses once per level, so a hostile
// file of a few hundred kilobytes of '[' would overflow the stack; real config files and
// safetensors headers nest two or three levels. Python's json module stops near 1000 as well.
constexpr size_t kMaxJsonDepth = 1000;

// Byte offset of the bracket that first nests deeper than kMaxJsonDepth, or npos. Brackets inside
// strings do not count; the text need not be valid JSON (the parser reports that).
size_t too_deep_at(std::string_view text) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

Json parse_json(std::string_view text, const std::string& source) {
  // The DOM parser keeps the last of repeated keys; a callback sees every key as it is read, so
  // each open object keeps the set of keys seen so far.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto watch = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (duplicate.empty() && !open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second)
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  // nlohmann's lexer stops at a NUL byte as if the text ended there, which would accept
  // "{}\0garbage"; a raw NUL is never valid JSON, so it is refused up front.
  const size_t nul = text.find('\0');
  EMBER_CHECK(nul == std::string_view::npos, source, ": invalid JSON: NUL byte at offset ", nul);
  const size_t deep = too_deep_at(text);
  EMBER_CHECK(deep == std::string_view::npos, source, ": invalid JSON: arrays and objects nested more than ",
              kMaxJsonDepth, " levels deep (at offset ", deep, ")");
  Json out;
  try {
    out = Json::parse(text.begin(), text.end(), watch);
  } catch (const Json::exception& e) {
    EMBER_FAIL(source, ": invalid JSON: ", without_exception_tag(e.what()));
  }
  if (duplicate.size() > 100) duplicate = duplicate.substr(0, 97) + "...";
  EMBER_CHECK(duplicate.empty(), source, ": invalid JSON: duplicate key '", duplicate, "'");
  return out;
}

JsonConfig::JsonConfig(Json object, std::string source) : JsonConfig(std::move(object), std::move(source), "") {}

JsonConfig::JsonConfig(Json object, std::string source, std::string prefix)
    : json_(std::move(object)), source_(std::move(source)), prefix_(std::move(prefix)) {
  EMBER_CHECK(json_.is_object(), source_, ": expected a JSON object",
              prefix_.empty() ? std::string() : " in field '" + prefix_.substr(0, prefix_.size() - 1) + "'",
              ", got ", json_type_name(json_));
}

JsonConfig JsonConfig::load(const std::string& path) { return parse(read_whole_file(path), path); }

JsonConfig JsonConfig::parse(std::string_view text, std::string source) {
  Json j = parse_json(text, source);
  EMBER_CHECK(j.is_object(), source, ": expected a JSON object at the top level, got ", json_type_name(j));
  return JsonConfig(std::move(j), std::move(source));
}

bool JsonConfig::contains(const std::string& key) const { return json_.contains(key); }

std::vector<std::string> JsonConfig::keys() const {
  std::vector<std::string> out;
  for (const auto& item : json_.items()) out.push_back(item.key());
  return out;
}

const Json& JsonConfig::required(const std::string& key) const {
  auto it = json_.find(key);
  EMBER_CHECK(it != json_.end(), source_, ": missing required field '", field(key), "'");
  return *it;
}

template <typename T> T JsonConfig::get(const std::string& key) const {
  return Convert<T>::from(required(key), Where{source_, field(key)});
}

template <typename T> std::optional<T> JsonConfig::get_optional(const std::string& key) const {
  auto it = json_.find(key);
  if (it == json_.end() || it->is_null()) return std::nullopt;
  return Convert<T>::from(*it, Where{source_, field(key)});
}

JsonConfig JsonConfig::get_object(const std::string& key) const {
  const Json& v = required(key);
  if (!v.is_object()) type_error(Where{source_, field(key)}, "an object", v);
  return JsonConfig(v, source_, field(key) + ".");
}

JsonConfig& JsonConfig::set_null(const std::string& key) {
  json_[key] = nullptr;
  return *this;
}

JsonConfig& JsonConfig::set_object(const std::string& key, const JsonConfig& value) {
  json_[key] = value.json_;
  return *this;
}

bool JsonConfig::erase(const std::string& key) { return json_.erase(key) > 0; }

std::string JsonConfig::dump() const {
  try {
    // ensure_ascii matches Python's json.dumps default, so files written here and by
    // transformers are byte-for-byte comparable.
    return json_.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
  } catch (const Json::exception& e) {
    EMBER_FAIL(source_, ": cannot write JSON: ", without_exception_tag(e.what()));
  }
}

void JsonConfig::save(const std::string& path) const { write_file_atomically(path, dump()); }

#define EMBER_JSON_CONFIG_TYPE(T)                                                   \
  template T JsonConfig::get<T>(const std::string&) const;                           \
  template std::optional<T> JsonConfig::get_optional<T>(const std::string&) const;
EMBER_JSON_CONFIG_TYPE(bool)
EMBER_JSON_CONFIG_TYPE(int)
EMBER_JSON_CONFIG_TYPE(int64_t)
EMBER_JSON_CONFIG_TYPE(float)
EMBER_JSON_CONFIG_TYPE(double)
EMBER_JSON_CONFIG_TYPE(std::string)
EMBER_JSON_CONFIG_TYPE(std::vector<int>)
EMBER_JSON_CONFIG_TYPE(std::vector<int64_t>)
EMBER_JSON_CONFIG_TYPE(std::vector<double>)
EMBER_JSON_CONFIG_TYPE(std::vector<std::string>)
using StringMap = std::map<std::string, std::string>;
using IntMap = std::map<std::string, int64_t>;
EMBER_JSON_CONFIG_TYPE(StringMap)
EMBER_JSON_CONFIG_TYPE(IntMap)
#undef EMBER_JSON_CONFIG_TYPE

}  // namespace ember::nn
