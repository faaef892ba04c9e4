// Counter-based random numbers (Philox4x32-10). Element i of a random op draws from counter
// (offset + i), so results depend only on the seed and the op sequence, never on the thread
// count or the device. Each op advances the generator's offset by the counters it used.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>

namespace ember {

struct Philox {
  // Returns four 32-bit random words for (key, counter).
  static std::array<uint32_t, 4> draw(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);
  static float to_uniform(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }  // [0,1)
};

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  // Reserves `n` counters and returns the first one; key = seed.
  GeneratorState reserve(uint64_t n);
  GeneratorState get_state() const;
  void set_state(const GeneratorState& s);

 private:
  mutable std::mutex mu_;
  GeneratorState state_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace ember
