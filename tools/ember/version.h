// The Ember release this command belongs to (the project version in CMakeLists.txt).
#pragma once
#include <ember/version.h>

namespace ember::cli {
inline constexpr const char* kEmberVersion = EMBER_VERSION;
}  // namespace ember::cli
