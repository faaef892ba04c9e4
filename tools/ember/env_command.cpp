// `ember env`: what to paste into a bug report. Build, CPU, accelerators, collective backends
// and the default launch config.
#include <sys/utsname.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <gloo/config.h>

#include "accelerate/launch_config.h"
#include "command_line.h"
#include "core/cpu_features.h"
#include "core/device_api.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/parallel_spin.h"
#include "subcommands.h"
#include "version.h"

namespace ember::cli {

namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  return "GCC " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string operating_system() {
  utsname u{};
  if (::uname(&u) != 0) return "unknown";
  return std::string(u.sysname) + " " + u.release + " " + u.machine;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string gpu_line() {
#ifdef EMBER_WITH_CUDA
  try {
    const int n = cuda_device_count();
    return std::to_string(n) + (n == 1 ? " device" : " devices");
  } catch (const Error& e) {
    return std::string("unavailable (") + e.what() + ")";
  }
#else
  return "none (Ember built without CUDA)";
#endif
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string env_usage() {
  return "usage: ember env\n\nPrints the Ember version, build, CPU, GPUs, collective backends and the default\n"
         "launch config, for bug reports.\n";
}

int env_command(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::cout << env_usage();
      return 0;
    }
    throw UsageError("unexpected argument '" + arg + "'");
  }
  std::ostringstream out;
  out << "Ember version: " << kEmberVersion << "\n";
  out << "Compiler: " << compiler() << " (C++ " << __cplusplus << ")\n";
  out << "Operating system: " << operating_system() << "\n";
  out << "CPU: " << cpu_model_name() << "\n";
  out << "CPU features:";
  for (const auto& [name, present] : cpu_feature_list()) out << " " << name << (present ? "=yes" : "=no");
  out << "\nCPU kernels: " << cpu_capability_name(cpu_capability()) << " (EMBER_CPU_CAPABILITY="
      << env_or("EMBER_CPU_CAPABILITY", "unset") << ")\n";
  out << "CPU cores (online): " << std::thread::hardware_concurrency() << "\n";
  out << "CPU cores (usable by this process): " << distributed::available_cpus() << "\n";
  out << "Ember threads: " << get_num_threads() << " (EMBER_NUM_THREADS=" << env_or("EMBER_NUM_THREADS", "unset")
      << ", OMP_NUM_THREADS=" << env_or("OMP_NUM_THREADS", "unset") << ")\n";
  out << "Ember pool polling before sleeping: " << detail::spin_microseconds() << " us (EMBER_SPIN_US="
      << env_or("EMBER_SPIN_US", "unset") << ")\n";
#ifdef EMBER_WITH_CUDA
  out << "CUDA build: yes\n";
#else
  out << "CUDA build: no\n";
#endif
  out << "CUDA devices: " << gpu_line() << "\n";
#ifdef EMBER_WITH_NCCL
  out << "NCCL: yes\n";
#else
  out << "NCCL: no (built without CUDA)\n";
#endif
  out << "Gloo: yes (" << GLOO_VERSION_MAJOR << "." << GLOO_VERSION_MINOR << "." << GLOO_VERSION_PATCH
      << ", TCP transport" << (GLOO_HAVE_TRANSPORT_TCP ? "" : " missing") << ")\n";

  std::string path;
  try {
    path = distributed::default_config_path();
  } catch (const Error& e) {
    out << "Default config: " << e.what() << "\n";
  }
  if (!path.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      out << "Default config: " << path << "\n";
      std::string status = "valid";
      try {
        distributed::LaunchConfig::load_yaml(path);
      } catch (const Error& e) {
        status = std::string("invalid: ") + e.what();
      }
      std::istringstream lines(read_file(path));
      for (std::string line; std::getline(lines, line);) out << "  " << line << "\n";
      out << "  (" << status << ")\n";
    } else {
      out << "Default config: no config file (" << path << ")\n";
    }
  }
  std::cout << out.str();
  return 0;
}

}  // namespace ember::cli
