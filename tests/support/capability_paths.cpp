#include "capability_paths.h"

#include <utility>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "same_bits.h"

namespace ember::testing {

bool cpu_has_avx512() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
}

void expect_avx2_and_avx512_agree(const std::string& what, const std::function<std::vector<Tensor>()>& fn) {
  const CpuCapability saved = cpu_capability();
  const int saved_threads = get_num_threads();
  std::vector<std::pair<std::string, std::vector<Tensor>>> runs;
  for (CpuCapability cap : {CpuCapability::Avx2, CpuCapability::Avx512})
    for (int threads : {1, 2}) {
      set_cpu_capability(cap);
      set_num_threads(threads);
      runs.emplace_back(std::string(cpu_capability_name(cap)) + (threads == 1 ? ", one thread" : ", two threads"),
                        fn());
    }
  set_cpu_capability(saved);
  set_num_threads(saved_threads);
  const std::vector<Tensor>& first = runs[0].second;
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].second.size(), first.size()) << what;
    for (size_t k = 0; k < first.size(); ++k)
      EXPECT_TRUE(same_bits(runs[r].second[k], first[k])) << what << ", " << runs[r].first << ", result " << k;
  }
}

}  // namespace ember::testing
