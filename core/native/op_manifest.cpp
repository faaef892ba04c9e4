#include "core/native/op_manifest.h"

#include <sstream>

#include "core/native/amp.h"
#include "core/native/convolution.h"
#include "core/native/copy.h"
#include "core/native/elementwise.h"
#include "core/native/fused.h"
#include "core/native/fused_optim.h"
#include "core/native/indexing.h"
#include "core/native/linalg.h"
#include "core/native/nn_functional.h"
#include "core/native/normalization.h"
#include "core/native/pooling.h"
#include "core/native/random.h"
#include "core/native/reduce.h"

namespace ember::native {
namespace {

std::vector<std::string> words(const char* text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

#define EMBER_NOT_DIFFERENTIABLE kNotDifferentiable

const std::vector<KernelEntry>& kernel_manifest() {
#define EMBER_KERNEL(stub, group, cpu_file, cuda_file, reason) KernelEntry{#stub, #group, cpu_file, cuda_file, reason},
#define EMBER_OP(name, group, stubs, reference, backward)
  static const std::vector<KernelEntry> entries = {
#include "core/native/op_manifest.def"
  };
#undef EMBER_KERNEL
#undef EMBER_OP
  return entries;
}

const std::vector<OpEntry>& op_manifest() {
#define EMBER_KERNEL(stub, group, cpu_file, cuda_file, reason)
#define EMBER_OP(name, group, stubs, reference, backward) OpEntry{#name, #group, words(stubs), reference, backward},
  static const std::vector<OpEntry> entries = {
#include "core/native/op_manifest.def"
  };
#undef EMBER_KERNEL
#undef EMBER_OP
  return entries;
}

std::map<std::string, StubRegistration> registered_kernels() {
  std::map<std::string, StubRegistration> out;
#define EMBER_KERNEL(stub, group, cpu_file, cuda_file, reason) \
  out[#stub] = StubRegistration{stub.cpu != nullptr, stub.cuda != nullptr};
#define EMBER_OP(name, group, stubs, reference, backward)
#include "core/native/op_manifest.def"
#undef EMBER_KERNEL
#undef EMBER_OP
  return out;
}

#undef EMBER_NOT_DIFFERENTIABLE

}  // namespace ember::native
