// ember::Error is the one exception type users catch. Messages name the op and the
// shapes/files/ranks involved so the user can act on them.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ember {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

inline std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os << ']';
}

inline std::string shape_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream ss;
  (ss << ... << args);
  return ss.str();
}
}  // namespace detail

}  // namespace ember

// EMBER_CHECK(cond, "op: message ", value, ...) throws ember::Error when cond is false.
#define EMBER_CHECK(cond, ...)                                      \
  do {                                                              \
    if (!(cond)) throw ::ember::Error(::ember::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define EMBER_FAIL(...) throw ::ember::Error(::ember::detail::str_cat(__VA_ARGS__))
