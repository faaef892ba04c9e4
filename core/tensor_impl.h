// The state behind a Tensor handle: a view (offset, shape, strides) into shared storage,
// plus the autograd fields. Handles share one TensorImpl; views share one Storage.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace ember {

class Tensor;
namespace autograd {
class Node;
}

struct RowSparseGrad;

// A hook run after a gradient has been accumulated into a leaf's .grad (sparse: into its
// row-sparse part); `id` is what its RemovableHandle removes.
struct PostAccumulateHook {
  uint64_t id = 0;
  std::shared_ptr<const std::function<void(const Tensor&)>> fn;
  bool sparse = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;       // in elements
  DType dtype = DType::f32;

  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;                   // which output of grad_fn this is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the node that accumulates into grad
  std::vector<PostAccumulateHook> post_accumulate_hooks;  // in registration order
  bool row_sparse_grad = false;  // embedding lookups give this leaf row-sparse gradients
  std::shared_ptr<RowSparseGrad> sparse_grad;  // the row-sparse part not yet added into grad
  uint64_t next_hook_id = 0;

  Device device() const { return storage->device(); }
  void* data() const {
    // An empty tensor's storage may have no memory at all; a view of it keeps its offset, and
    // offsetting a null pointer is undefined behaviour, so it stays null.
    char* base = static_cast<char*>(storage->data());
    return base == nullptr ? nullptr : base + offset * int64_t(dtype_size(dtype));
  }
};

}  // namespace ember
