// libFuzzer target: nn::load_safetensors_with_metadata and read_safetensors_header on arbitrary
// bytes. An ember::Error is the expected outcome of a malformed file; anything else is a bug.
#include "fuzz/fuzz_common.h"
#include "nn/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ember::fuzz::write_temp(data, size, "safetensors", ".safetensors");
  try {
    auto header = ember::nn::read_safetensors_header(path);
    auto file = ember::nn::load_safetensors_with_metadata(path);
    // A file that loads must agree with its header.
    if (file.tensors.size() != header.tensors.size()) std::abort();
    for (const auto& [name, entry] : header.tensors) {
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) std::abort();
      if (it->second.numel() * int64_t(ember::dtype_size(it->second.dtype())) != entry.end - entry.begin) std::abort();
    }
  } catch (const ember::Error&) {
  }
  return 0;
}
