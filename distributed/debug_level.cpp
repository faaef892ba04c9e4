#include "distributed/debug_level.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ember::distributed {

DebugLevel debug_level() {
  const char* raw = std::getenv("EMBER_DISTRIBUTED_DEBUG");
  std::string v;
  for (const char* c = raw; c && *c; ++c) v.push_back(char(std::toupper(static_cast<unsigned char>(*c))));
  if (v.empty() || v == "OFF" || v == "0") return DebugLevel::Off;
  if (v == "INFO") return DebugLevel::Info;
  if (v == "DETAIL" || v == "1") return DebugLevel::Detail;
  EMBER_FAIL("EMBER_DISTRIBUTED_DEBUG='", raw, "': expected OFF, INFO or DETAIL");
}

}  // namespace ember::distributed
