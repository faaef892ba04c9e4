// ProcessGroupGloo: collectives on CPU tensors over TCP, through Gloo.
//
// Collectives run on one background thread per group, in the order they were issued (every
// rank must issue them in the same order); allreduce, broadcast, reduce_scatter and
// allgather_into return at once with a Work, so the caller keeps computing while the bytes
// move. allgather, allgather_bytes and barrier wait for their turn and their result.
//
// Every collective is bounded by options.timeout. A dead or missing peer fails the collective
// on every surviving rank with an ember::Error naming the operation, the world size and the
// rank(s) that did not answer where they are known; after such a failure the group refuses
// further collectives (with the first error), since its connections are no longer in step.
// Creating a group sets SIGPIPE to ignored unless the program installed its own handler: a
// write to a dead peer must fail the collective, not kill the process.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace ember::distributed {

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Joins the group: publishes this rank's address in `store`, waits (at most options.timeout)
  // until all `size` ranks joined, naming any missing rank, and connects to every peer.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options = {});
  ~ProcessGroupGloo() override;
  ProcessGroupGloo(const ProcessGroupGloo&) = delete;
  ProcessGroupGloo& operator=(const ProcessGroupGloo&) = delete;

  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const;
  // Where this rank accepts connections from its peers, e.g. "[127.0.0.1]:41523" (empty for a
  // group of one).
  std::string address() const;

  // f32 f64 f16 bf16 i32 i64; f16/bf16 are combined in float, element by element.
  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) override;
  std::vector<Tensor> allgather(const Tensor& tensor) override;
  // Queued on the group's thread like allreduce; the ranks' numel and dtype are compared first,
  // so a mismatch fails on every rank with both named and the group stays usable.
  std::shared_ptr<Work> allgather_into(Tensor output, const Tensor& input) override;
  // Reduces a copy of `input` across ranks and keeps this rank's chunk (input is not changed).
  std::shared_ptr<Work> reduce_scatter(Tensor output, const Tensor& input, ReduceOp op = ReduceOp::Sum) override;
  void barrier() override;
  std::vector<Bytes> allgather_bytes(const Bytes& mine) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::distributed
