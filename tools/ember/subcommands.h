// The `ember` subcommands. Each takes the arguments after its name and returns the exit
// status; a mistake in the arguments is thrown as UsageError, any other failure as ember::Error.
#pragma once
#include <string>
#include <vector>

namespace ember::cli {

int launch_command(const std::vector<std::string>& args);
int config_command(const std::vector<std::string>& args);
int env_command(const std::vector<std::string>& args);
int plot_command(const std::vector<std::string>& args);
int merge_weights_command(const std::vector<std::string>& args);

std::string launch_usage();
std::string config_usage();
std::string env_usage();
std::string plot_usage();
std::string merge_weights_usage();

}  // namespace ember::cli
