// What must not compile. A guard written as a bare statement (`acc.accumulate(m);`,
// `acc.autocast();`) would end at its own semicolon and change nothing, so including
// <ember/accelerate.h> makes discarding one a compile error that names the fix. Each program
// here is compiled by this build's C++ compiler (-fsyntax-only) against the source tree.
#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>  // the programs below use std::make_tuple

#include "test_util.h"

namespace {

struct Compiled {
  int status = -1;
  std::string output;
};

// Compiles `program` as a user's file would be, with the compiler and include paths of this build.
Compiled compile(const ember::testing::TempDir& dir, const std::string& name, const std::string& program) {
  const std::string file = dir.file(name + ".cpp");
  std::ofstream(file) << program;
  const std::string source = EMBER_SOURCE_DIR;
  const std::string command = std::string("'") + EMBER_CXX_COMPILER + "' -std=c++20 -fsyntax-only -Wall -I'" + source +
                              "' -I'" + source + "/include' -I'" + EMBER_BINARY_DIR + "/include' '" + file + "' 2>&1";
  Compiled out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  std::array<char, 4096> chunk{};
  while (size_t n = std::fread(chunk.data(), 1, chunk.size(), pipe)) out.output.append(chunk.data(), n);
  out.status = pclose(pipe);
  return out;
}

const char* kPrelude = R"(#include <ember/accelerate.h>
using namespace ember;
int main() {
  Accelerator acc;
  auto model = std::make_shared<nn::Linear>(2, 1);
  auto m = acc.prepare(model);
)";

}  // namespace

TEST(AcceleratorGuards, ABareGuardStatementDoesNotCompileAndTheErrorNamesTheFix) {
  ember::testing::TempDir dir("accel_guards");
  const Compiled bare = compile(dir, "bare", std::string(kPrelude) + R"(
  acc.accumulate(m);
  acc.autocast();
  acc.no_sync(m);
  acc.main_process_first();
}
)");
  EXPECT_NE(bare.status, 0) << bare.output;
  for (const char* fix : {"auto guard = acc.accumulate(m);", "auto autocast = acc.autocast();",
                          "auto local = acc.no_sync(m);", "auto first = acc.main_process_first();"})
    EXPECT_NE(bare.output.find(fix), std::string::npos) << "no error naming `" << fix << "`:\n" << bare.output;
  EXPECT_NE(bare.output.find("error"), std::string::npos) << bare.output;
}

TEST(AcceleratorGuards, TheGuardsKeptInVariablesCompile) {
  ember::testing::TempDir dir("accel_guards_ok");
  // The same calls written as the documentation writes them, and a deliberate (void) discard.
  const Compiled kept = compile(dir, "kept", std::string(kPrelude) + R"(
  {
    auto guard = acc.accumulate(m);
    auto autocast = acc.autocast();
    auto local = acc.no_sync(m);
    auto first = acc.main_process_first();
  }
  (void)acc.autocast();
  acc.save_model(m, "unused");
  acc.print("Process", acc.process_index(), "of", acc.num_processes());
  auto [a, b] = acc.gather(std::make_tuple(full({2}, 1.0), arange(int64_t(2))));
  return int(a.numel() + b.numel()) - 4;
}
)");
  EXPECT_EQ(kept.status, 0) << kept.output;
  // EMBER_ALLOW_DISCARDED_RESULTS keeps the compiler's warning instead of the error.
  const Compiled allowed =
      compile(dir, "allowed", "#define EMBER_ALLOW_DISCARDED_RESULTS\n" + std::string(kPrelude) + "  acc.autocast();\n}\n");
  EXPECT_EQ(allowed.status, 0) << allowed.output;
  EXPECT_NE(allowed.output.find("auto autocast = acc.autocast();"), std::string::npos) << allowed.output;
}
