#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace ember::data {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), 0);
  // Fisher-Yates with Philox draws keyed by the seed; the epoch selects the counter stream.
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = Philox::draw(seed, uint64_t(epoch) + 1, uint64_t(i));
    const uint64_t x = (uint64_t(r[0]) << 32) | r[1];
    const int64_t j = int64_t(x % uint64_t(i + 1));
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> v(static_cast<size_t>(n_));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

uint64_t draw_seed() {
  const GeneratorState st = default_generator().reserve(1);
  const auto r = Philox::draw(st.seed, 0, st.offset);
  return (uint64_t(r[0]) << 32) | r[1];
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const { return seeded_permutation(n_, seed_, epoch); }

std::shared_ptr<const Sampler> RandomSampler::with_seed(uint64_t seed) const {
  auto copy = std::make_shared<RandomSampler>(*this);
  copy->seed_ = seed;
  return copy;
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices, int64_t batch_size,
                                               bool drop_last) {
  EMBER_CHECK(batch_size > 0, "DataLoader: batch_size must be positive, got ", batch_size);
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < indices.size(); i += size_t(batch_size)) {
    const size_t end = std::min(indices.size(), i + size_t(batch_size));
    if (drop_last && end - i < size_t(batch_size)) break;
    out.emplace_back(indices.begin() + int64_t(i), indices.begin() + int64_t(end));
  }
  return out;
}

}  // namespace ember::data
