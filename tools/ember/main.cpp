// The `ember` command: launch, config, env, plot, merge-weights.
#include <fcntl.h>
#include <unistd.h>

#include <iostream>
#include <map>

#include "command_line.h"
#include "core/error.h"
#include "subcommands.h"
#include "version.h"

namespace {

using namespace ember::cli;

struct Subcommand {
  int (*run)(const std::vector<std::string>&);
  std::string (*usage)();
};

const std::map<std::string, Subcommand>& subcommands() {
  static const std::map<std::string, Subcommand> table = {
      {"launch", {launch_command, launch_usage}},
      {"config", {config_command, config_usage}},
      {"env", {env_command, env_usage}},
      {"plot", {plot_command, plot_usage}},
      {"merge-weights", {merge_weights_command, merge_weights_usage}},
  };
  return table;
}

std::string usage() {
  return "usage: ember <command> [options]\n"
         "\n"
         "commands:\n"
         "  launch    start a program as several ranks (processes), on one machine or several\n"
         "  config    write the config file that `ember launch` reads\n"
         "  env       print the version, build, hardware and default config\n"
         "  plot      draw runs' logged metrics as one self-contained HTML report\n"
         "  merge-weights  one model.safetensors from a (sharded) save_state checkpoint\n"
         "\n"
         "`ember <command> --help` describes a command's options.\n";
}

// Descriptors 0-2 closed by whoever started us would be handed out for pipes and then
// clobbered when the ranks' output is wired up.
void ensure_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_descriptors();
  if (argc < 2) {
    std::cerr << usage();
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    std::cout << usage();
    return 0;
  }
  if (name == "--version") {
    std::cout << "ember " << kEmberVersion << "\n";
    return 0;
  }
  const auto it = subcommands().find(name);
  if (it == subcommands().end()) {
    std::cerr << "ember: unknown command '" << name << "'\n\n" << usage();
    return 2;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.run(args);
  } catch (const UsageError& e) {
    std::cerr << "ember " << name << ": " << e.what() << "\n\n" << it->second.usage();
    return 2;
  } catch (const ember::Error& e) {
    const std::string message = e.what();
    const std::string prefix = "ember " + name + ":";
    std::cerr << (message.rfind(prefix, 0) == 0 ? "" : prefix + " ") << message << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ember " << name << ": " << e.what() << "\n";
    return 1;
  }
}
