#include "core/rng.h"

#include "core/philox_rounds.h"

namespace ember {

std::array<uint32_t, 4> Philox::draw(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c[4] = {uint32_t(counter_lo), uint32_t(counter_lo >> 32), uint32_t(counter_hi), uint32_t(counter_hi >> 32)};
  philox_rounds(c, key);
  return {c[0], c[1], c[2], c[3]};
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = {seed, 0};
}

GeneratorState Generator::reserve(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  GeneratorState s = state_;
  state_.offset += n;
  return s;
}

GeneratorState Generator::get_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void Generator::set_state(const GeneratorState& s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace ember
