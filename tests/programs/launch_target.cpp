// A program for `ember launch` tests to start as ranks. It runs the actions on its command
// line in order; `--rank R` makes the following actions apply to rank R only (the rank comes
// from $RANK), `--rank all` to every rank again.
//
//   --print-env        one "ENV NAME=value" line per launch variable ("<unset>" when missing),
//                      then one per EMBER_FSDP_* variable present
//   --pid              "PID <pid>"
//   --echo TEXT        TEXT on its own line
//   --lines N          N lines "line I of rank R xxxx..." on stdout
//   --stderr-lines N   N lines "err I of rank R" on stderr
//   --partial TEXT     TEXT on stdout with no newline
//   --ignore-sigterm   SIGTERM is ignored from now on
//   --sleep SECONDS    sleeps (fractions allowed)
//   --exit CODE        exits with CODE
//   --signal N         dies by signal N
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

extern char** environ;

namespace {

const char* kVariables[] = {"MASTER_ADDR",          "MASTER_PORT",
                            "RANK",                 "WORLD_SIZE",
                            "LOCAL_RANK",           "LOCAL_WORLD_SIZE",
                            "GROUP_RANK",           "EMBER_MIXED_PRECISION",
                            "EMBER_GRADIENT_ACCUMULATION_STEPS", "EMBER_USE_CPU",
                            "EMBER_NUM_THREADS",    "OMP_NUM_THREADS",
                            "EMBER_USE_FSDP"};

int fail(const std::string& message) {
  std::fprintf(stderr, "launch_target: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  const std::string my_rank = rank_env ? rank_env : "0";
  std::string only = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string action = argv[i];
    const bool has_value = i + 1 < argc;
    const std::string value = has_value ? argv[i + 1] : "";
    const bool needs_value = action != "--print-env" && action != "--pid" && action != "--ignore-sigterm";
    if (needs_value && !has_value) return fail("option " + action + " needs a value");
    if (needs_value) ++i;
    if (action == "--rank") {
      only = value;
      continue;
    }
    if (only != "all" && only != my_rank) continue;

    if (action == "--print-env") {
      for (const char* name : kVariables) {
        const char* v = std::getenv(name);
        std::printf("ENV %s=%s\n", name, v ? v : "<unset>");
      }
      for (char** e = environ; e && *e; ++e)
        if (std::strncmp(*e, "EMBER_FSDP_", 11) == 0) std::printf("ENV %s\n", *e);
    } else if (action == "--pid") {
      std::printf("PID %d\n", int(::getpid()));
    } else if (action == "--echo") {
      std::printf("%s\n", value.c_str());
    } else if (action == "--lines") {
      const std::string padding(100, 'x');
      for (int n = std::atoi(value.c_str()), k = 0; k < n; ++k)
        std::printf("line %d of rank %s %s\n", k, my_rank.c_str(), padding.c_str());
    } else if (action == "--stderr-lines") {
      for (int n = std::atoi(value.c_str()), k = 0; k < n; ++k)
        std::fprintf(stderr, "err %d of rank %s\n", k, my_rank.c_str());
    } else if (action == "--partial") {
      std::printf("%s", value.c_str());
    } else if (action == "--ignore-sigterm") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (action == "--sleep") {
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(value.c_str())));
    } else if (action == "--exit") {
      std::fflush(stdout);
      std::exit(std::atoi(value.c_str()));
    } else if (action == "--signal") {
      std::fflush(stdout);
      const int sig = std::atoi(value.c_str());
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      return fail("still alive after signal " + value);
    } else {
      return fail("unknown action " + action);
    }
    std::fflush(stdout);
  }
  return 0;
}
