#include "tracking/tracker.h"

#include <charconv>

namespace ember::tracking {

std::string TrackerValue::to_string() const {
  struct Visitor {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      char buf[64];
      auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
      return ec == std::errc() ? std::string(buf, end) : std::string("?");
    }
    std::string operator()(const std::string& v) const { return v; }
  };
  return std::visit(Visitor{}, value_);
}

}  // namespace ember::tracking
