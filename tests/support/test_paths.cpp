// The one object of the test support library that is compiled with the build's absolute paths
// (tests/CMakeLists.txt defines them for this file only).
#include "test_paths.h"

namespace ember::testing::paths {
const char* source_dir() { return EMBER_TEST_PATH_SOURCE_DIR; }
const char* test_programs() { return EMBER_TEST_PATH_PROGRAMS; }
const char* cli() { return EMBER_TEST_PATH_CLI; }
}  // namespace ember::testing::paths
