#pragma once
// Where the tests find the source tree, the test programs and the `ember` command. Every test
// file sees this header through `-include` (tests/CMakeLists.txt), so the paths reach the tests
// as calls into the support library instead of string literals: a test object then holds no
// absolute path and a fresh clone elsewhere compiles it from the compiler cache.
namespace ember::testing::paths {
const char* source_dir();     // the repository root
const char* test_programs();  // build/tests/programs
const char* cli();            // build/bin/ember
}  // namespace ember::testing::paths

#define EMBER_SOURCE_DIR (::ember::testing::paths::source_dir())
#define EMBER_TEST_PROGRAMS (::ember::testing::paths::test_programs())
#define EMBER_CLI (::ember::testing::paths::cli())
