// Collectives on tensors and byte blobs the way a training loop wants them, the twins of
// accelerate.utils.operations. Every function takes the job's process group; nullptr means a
// single process, where each one is the identity (a copy). Every process must call them in the
// same order (they are collectives).
//
// Tensors on a CUDA device go through a "gloo" group by way of host memory.
//
// gather, reduce, pad_across_processes and broadcast also take a nested structure of tensors
// (distributed/tensor_tree.h: std::tuple, std::pair, std::vector, Batch, std::map of them) and
// return the same structure, each tensor treated as the single-tensor form treats it. The
// tensors travel together: reduce and broadcast make one collective per dtype (the tensors of
// a dtype packed into one buffer); gather exchanges every tensor's shape once, then moves the
// data in one collective per dtype; pad_across_processes makes one exchange of shapes in all.
#pragma once
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/tensor_tree.h"

namespace ember::distributed {

// Concatenates every process's tensor along dim 0, in rank order. Dim 0 may differ between
// processes (the other dims and the dtype must agree); a 0-dim tensor counts as one row.
Tensor gather(const Tensor& tensor, ProcessGroup* pg);

// "sum" or "mean" of the tensor over processes, times `scale`; "mean" needs a floating dtype.
Tensor reduce(const Tensor& tensor, const std::string& reduction, ProcessGroup* pg, double scale = 1.0);

// Pads `tensor` along `dim` with `pad_index` up to the largest size any process has there, at
// the end (or at the start with pad_first), so tensors of different lengths can be gathered as
// equal blocks. Only `dim` changes: the other dims are this process's own, as in Accelerate
// (they may differ between processes). Every process must pass as many dims; `dim` must be one
// of them (a structure's tensors that have no dim `dim`, 0-dim ones included, come back as
// they are, as Accelerate returns them).
Tensor pad_across_processes(const Tensor& tensor, ProcessGroup* pg, int64_t dim = 0, double pad_index = 0,
                            bool pad_first = false);

// Every process receives process `from`'s tensor (same shape and dtype everywhere).
Tensor broadcast(const Tensor& tensor, ProcessGroup* pg, int from = 0);

namespace detail {
// The structured forms on a structure's leaves (their names label the errors).
std::vector<Tensor> gather_leaves(const TensorLeaves& leaves, ProcessGroup* pg);
std::vector<Tensor> reduce_leaves(const TensorLeaves& leaves, const std::string& reduction, ProcessGroup* pg,
                                  double scale);
std::vector<Tensor> pad_leaves(const TensorLeaves& leaves, ProcessGroup* pg, int64_t dim, double pad_index,
                               bool pad_first);
std::vector<Tensor> broadcast_leaves(const TensorLeaves& leaves, ProcessGroup* pg, int from);
}  // namespace detail

template <NestedTensors S>
tensor_tree_t<S> gather(const S& tensors, ProcessGroup* pg) {
  return rebuild_tensors(tensors, detail::gather_leaves(flatten_tensors(tensors), pg));
}
template <NestedTensors S>
tensor_tree_t<S> reduce(const S& tensors, const std::string& reduction, ProcessGroup* pg, double scale = 1.0) {
  return rebuild_tensors(tensors, detail::reduce_leaves(flatten_tensors(tensors), reduction, pg, scale));
}
template <NestedTensors S>
tensor_tree_t<S> pad_across_processes(const S& tensors, ProcessGroup* pg, int64_t dim = 0, double pad_index = 0,
                                      bool pad_first = false) {
  return rebuild_tensors(tensors, detail::pad_leaves(flatten_tensors(tensors), pg, dim, pad_index, pad_first));
}
template <NestedTensors S>
tensor_tree_t<S> broadcast(const S& tensors, ProcessGroup* pg, int from = 0) {
  return rebuild_tensors(tensors, detail::broadcast_leaves(flatten_tensors(tensors), pg, from));
}

// Byte blobs: every process's blob in rank order, and process `from`'s blob everywhere.
std::vector<Bytes> gather_object(const Bytes& mine, ProcessGroup* pg);
Bytes broadcast_object(const Bytes& value, ProcessGroup* pg, int from = 0);
std::vector<std::string> gather_object(const std::string& mine, ProcessGroup* pg);
std::string broadcast_object(const std::string& value, ProcessGroup* pg, int from = 0);

}  // namespace ember::distributed
