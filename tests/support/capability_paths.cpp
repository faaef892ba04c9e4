#include "capability_paths.h"

#include "core/cpu_features.h"
#include "same_bits.h"

namespace ember::testing {

bool cpu_has_avx512() {
  const CpuFeatures &f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
}

void expect_avx2_and_avx512_agree(const std::string &what, const std::function<std::vector<Tensor>()> &fn) {
  const CpuCapability saved = cpu_capability();
  set_cpu_capability(CpuCapability::Avx2);
  const std::vector<Tensor> narrow = fn();
  set_cpu_capability(CpuCapability::Avx512);
  const std::vector<Tensor> wide = fn();
  set_cpu_capability(saved);
  ASSERT_EQ(narrow.size(), wide.size()) << what;
  for (size_t k = 0; k < narrow.size(); ++k) EXPECT_TRUE(same_bits(wide[k], narrow[k])) << what << ", result " << k;
}

}  // namespace ember::testing
