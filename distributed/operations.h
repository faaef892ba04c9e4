// Collectives on tensors and byte blobs the way a training loop wants them, the twins of
// accelerate.utils.operations. Every function takes the job's process group; nullptr means a
// single process, where each one is the identity (a copy). Every process must call them in the
// same order (they are collectives).
//
// Tensors on a CUDA device go through a "gloo" group by way of host memory.
#pragma once
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace ember::distributed {

// Concatenates every process's tensor along dim 0, in rank order. Dim 0 may differ between
// processes (the other dims and the dtype must agree); a 0-dim tensor counts as one row.
Tensor gather(const Tensor& tensor, ProcessGroup* pg);

// "sum" or "mean" of the tensor over processes, times `scale`; "mean" needs a floating dtype.
Tensor reduce(const Tensor& tensor, const std::string& reduction, ProcessGroup* pg, double scale = 1.0);

// Pads `tensor` along `dim` with `pad_index` up to the largest size any process has there, at
// the end (or at the start with pad_first), so tensors of different lengths can be gathered as
// equal blocks. The other dims must agree.
Tensor pad_across_processes(const Tensor& tensor, ProcessGroup* pg, int64_t dim = 0, double pad_index = 0,
                            bool pad_first = false);

// Every process receives process `from`'s tensor (same shape and dtype everywhere).
Tensor broadcast(const Tensor& tensor, ProcessGroup* pg, int from = 0);

// Byte blobs: every process's blob in rank order, and process `from`'s blob everywhere.
std::vector<Bytes> gather_object(const Bytes& mine, ProcessGroup* pg);
Bytes broadcast_object(const Bytes& value, ProcessGroup* pg, int from = 0);
std::vector<std::string> gather_object(const std::string& mine, ProcessGroup* pg);
std::string broadcast_object(const std::string& value, ProcessGroup* pg, int from = 0);

}  // namespace ember::distributed
