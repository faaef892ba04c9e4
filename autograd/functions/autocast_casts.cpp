// The differentiable casts of the autocast policy (core/autocast.h), with the per-region cache
// of lower-precision copies of leaf weights: a weight used by several ops in one forward (or
// tied, like BERT's decoder and word embeddings) is cast once, and its gradient still
// reaches the f32 parameter through that one cast.
#include <unordered_map>

#include "autograd/node.h"
#include "core/autocast.h"
#include "core/grad_mode.h"

namespace ember::autocast {
namespace {
struct CachedCast {
  Tensor source;  // held so the address cannot be reused by another tensor while cached
  Tensor cast;
};
thread_local std::unordered_map<const TensorImpl*, CachedCast> weight_cache;

bool castable(const Tensor& x) { return x.defined() && x.is_floating_point(); }
}  // namespace

void clear_cache() { weight_cache.clear(); }

Tensor to_lower(const Tensor& x) {
  if (!castable(x) || !active_for(x)) return x;
  const DType target = autocast_dtype(x.device().type);
  if (x.dtype() != DType::f32) return x;  // f64 is not autocast (as in PyTorch); halves stay
  const bool cacheable = x.is_leaf() && x.requires_grad() && GradMode::is_enabled();
  if (!cacheable) return x.to(target);
  auto it = weight_cache.find(x.impl());
  if (it != weight_cache.end() && it->second.cast.dtype() == target) return it->second.cast;
  Tensor cast = x.to(target);
  weight_cache[x.impl()] = CachedCast{x, cast};
  return cast;
}

Tensor to_f32(const Tensor& x) {
  if (!castable(x) || !active_for(x)) return x;
  if (x.dtype() != DType::f16 && x.dtype() != DType::bf16) return x;
  return x.to(DType::f32);
}

}  // namespace ember::autocast
