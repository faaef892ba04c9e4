// libFuzzer target: the IDX reader (MNIST / Fashion-MNIST files, plain or gzip) on arbitrary
// bytes, then the conversion to a tensor. Only ember::Error may escape; a header may not make the
// reader allocate more than the bound it is given.
#include <cstdint>
#include <string>

#include "data/idx_file.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ember::fuzz::write_temp(data, size, "idx", ".idx");
  try {
    ember::data::IdxArray array = ember::data::read_idx(path, int64_t(1) << 20);
    ember::Tensor t = array.to_tensor();
    if (t.numel() != array.numel()) std::abort();
  } catch (const ember::Error&) {
  }
  return 0;
}
