#include "core/native/random.h"

namespace ember::native {

EMBER_DEFINE_STUB(random_stub);

void random_fill(const Tensor& out, RandomKind kind, double a, double b, Generator& gen) {
  EMBER_CHECK(out.is_contiguous(), "random: output must be contiguous");
  if (kind == RandomKind::Integer) {
    EMBER_CHECK(a < b, "randint: low (", a, ") must be below high (", b, ")");
  }
  if (out.numel() == 0) return;
  const GeneratorState st = gen.reserve(uint64_t(out.numel()));
  random_stub.call(out.device(), "random")(out, kind, a, b, st);
  out.bump_version();
}

}  // namespace ember::native
