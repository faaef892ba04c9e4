// The op manifest (core/native/op_manifest.def) as tables: which stub each kernel registers
// under and in which file, and for every public op its stubs, reference and backward. It lets
// one test check that no op lacks a kernel, a reference or a gradient check.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ember::native {

inline constexpr const char* kNotDifferentiable = "not differentiable";

struct KernelEntry {
  std::string stub;               // the DispatchStub in core/native/<group>.h
  std::string group;              // the op group, which names the files
  std::string cpu_file;           // under kernels/cpu; "" when there is no CPU kernel
  std::string cuda_file;          // under kernels/cuda; "" when there is no CUDA kernel
  std::string one_device_reason;  // why cpu_file or cuda_file is ""
};

struct OpEntry {
  std::string name;   // the function in core/ops.h
  std::string group;  // the op group, which names the files
  std::vector<std::string> stubs;
  std::string reference;  // the function in kernels/reference/<group>.h
  std::string backward;   // the autograd node its result records, or kNotDifferentiable

  bool differentiable() const { return backward != kNotDifferentiable; }
};

const std::vector<KernelEntry>& kernel_manifest();
const std::vector<OpEntry>& op_manifest();

// What the loaded library holds for one stub: whether a CPU and a CUDA kernel registered.
struct StubRegistration {
  bool cpu = false;
  bool cuda = false;
};
// The registration of every stub in kernel_manifest(), read from the dispatch slots.
std::map<std::string, StubRegistration> registered_kernels();

}  // namespace ember::native
