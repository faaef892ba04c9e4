// Argument checks and result layout shared by the process group backends, so that every backend
// rejects the same calls with the same messages and lays out gathered tensors alike.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"

namespace ember::distributed {

// "allreduce (world 4, rank 1)": how backends name a collective in their errors.
std::string collective_where(const char* op, int size, int rank);

// Avg is defined for floating-point tensors only.
void check_reduce_op_dtype(const std::string& where, ReduceOp op, const Tensor& t);
void check_root(const std::string& where, int root, int size);
// input splits into `size` equal chunks along dim 0, output is one chunk of the same dtype, and
// `op` suits the dtype.
void check_reduce_scatter(const std::string& where, const Tensor& output, const Tensor& input, ReduceOp op, int size);

// allgather_into: output has size * input.numel() elements and input's dtype and device.
void check_allgather_into(const std::string& where, const Tensor& output, const Tensor& input, int size);
// Whether the bytes of two contiguous tensors share any address.
bool bytes_overlap(const Tensor& a, const Tensor& b);

// allgather: each rank's shape and dtype, in rank order. They may differ only in dim 0; when
// they differ otherwise from `mine`, returns the message naming every rank's shape and dtype.
std::optional<std::string> allgather_mismatch(const std::string& where, const Shape& mine, DType mine_dtype,
                                              const std::vector<Shape>& shapes, const std::vector<DType>& dtypes);
// The gathered tensor holds every rank's piece back to back along dim 0 (a 0-d piece is one row).
Shape allgather_output_shape(const Shape& mine, const std::vector<Shape>& shapes);
// Elements of each rank's piece.
std::vector<size_t> allgather_counts(const std::vector<Shape>& shapes);
// The views of `out` that are the pieces of each rank.
std::vector<Tensor> split_allgather_output(const Tensor& out, const std::vector<Shape>& shapes);

}  // namespace ember::distributed
