// The Ember release this command belongs to (the project version in CMakeLists.txt).
#pragma once

namespace ember::cli {
inline constexpr const char* kEmberVersion = "0.1.0";
}  // namespace ember::cli
