// CPU dropout. Element i keeps when the Philox uniform of counter (offset + i) is >= p, so the
// mask depends only on the generator state, never on how the range is split across threads.
// Dropped elements are multiplied by zero (not overwritten), so NaN and inf still show, as in
// PyTorch.
#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

constexpr int64_t kBlock = 2048;  // mask and apply in cache-sized blocks

void dropout_cpu(const Tensor& out, const Tensor& mask, const Tensor& x, double p, double scale, GeneratorState st) {
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* in = x.data_ptr<T>();
    T* o = out.data_ptr<T>();
    bool* m = mask.data_ptr<bool>();
    const A s = A(scale);
    parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = std::min(end, b + kBlock);
        for (int64_t i = b; i < e; ++i)
          m[i] = double(Philox::to_uniform(Philox::draw(st.seed, 0, st.offset + uint64_t(i))[0])) >= p;
        for (int64_t i = b; i < e; ++i) o[i] = T(A(in[i]) * (m[i] ? s : A(0)));
      }
    });
  });
}

void dropout_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  visit_floating(grad_out.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* g = grad_out.data_ptr<T>();
    const bool* m = mask.data_ptr<bool>();
    T* o = grad_in.data_ptr<T>();
    const A s = A(scale);
    parallel_for(0, grad_out.numel(), 32768, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = T(A(g[i]) * (m[i] ? s : A(0)));
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::dropout_stub, CPU, &dropout_cpu);
EMBER_REGISTER_KERNEL(native::dropout_backward_stub, CPU, &dropout_backward_cpu);

}  // namespace ember
