// Shared helpers for the libFuzzer targets: a per-process temporary file that readers taking a
// path can open, and the one rule every target enforces (ember::Error is the only acceptable
// failure; anything else escapes and libFuzzer reports it as a crash).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ember::fuzz {

// Writes the input to $TMPDIR/ember_fuzz_<tag>_<pid><suffix> and returns its path. The same
// path is reused for every input of the run (the readers reopen it each time).
inline std::string write_temp(const uint8_t* data, size_t size, const char* tag, const char* suffix = "") {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/ember_fuzz_" + tag + "_" +
                     std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace ember::fuzz
