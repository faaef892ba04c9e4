// A choice between kernel paths that tests and benchmarks can force: read once from an
// environment variable (EMBER_F32_GEMM=packed, say), changed later through a setter, and
// otherwise left to the caller's automatic rule. A value the variable does not name is an
// ember::Error listing the names it takes.
#pragma once
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ember {

template <typename Choice>
class ForcedChoice {
 public:
  struct Named {
    const char* name;
    Choice value;
  };

  ForcedChoice(const char* env, std::initializer_list<Named> names) : names_(names) {
    const char* v = std::getenv(env);
    if (v == nullptr || *v == '\0') return;
    for (const Named& n : names_)
      if (n.name == std::string(v)) {
        forced_.store(static_cast<int>(n.value), std::memory_order_relaxed);
        return;
      }
    std::string expected;
    for (size_t i = 0; i < names_.size(); ++i)
      expected += (i == 0 ? "" : i + 1 == names_.size() ? " or " : ", ") + std::string(names_[i].name);
    EMBER_FAIL(env, ": expected ", expected, ", got '", v, "'");
  }

  // The forced choice, or nullopt for the automatic one.
  std::optional<Choice> get() const {
    const int v = forced_.load(std::memory_order_relaxed);
    return v == kAutomatic ? std::nullopt : std::optional<Choice>(static_cast<Choice>(v));
  }
  void set(std::optional<Choice> c) {
    forced_.store(c ? static_cast<int>(*c) : kAutomatic, std::memory_order_relaxed);
  }
  const char* name(Choice c) const {
    for (const Named& n : names_)
      if (n.value == c) return n.name;
    return "?";
  }

 private:
  static constexpr int kAutomatic = -1;
  std::vector<Named> names_;
  std::atomic<int> forced_{kAutomatic};
};

}  // namespace ember
