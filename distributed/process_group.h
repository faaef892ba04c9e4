// ProcessGroup: collectives over the ranks of one job. Backends: Gloo (CPU tensors, TCP) and
// NCCL (CUDA tensors). Every collective has a timeout: a dead or missing peer becomes an
// ember::Error naming the operation and the rank(s), on every surviving rank, never a hang.
//
// Tensors are reduced in place. Collectives are issued in the same order on every rank.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/store.h"

namespace ember::distributed {

// Avg is the sum divided by size(); it is defined for floating-point tensors only (integer
// tensors raise ember::Error: reduce with Sum and divide as the caller sees fit).
enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Handle on a collective in flight. wait() blocks until it finished (at most about the group's
// timeout) and rethrows its error; calling wait() again rethrows again.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

struct ProcessGroupOptions {
  // Bound on setup and on every collective; past it the collective fails on every rank.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gloo: the network interface (e.g. "eth0") or the address/hostname other ranks reach this
  // rank at. Empty: EMBER_GLOO_IFNAME / EMBER_GLOO_HOSTNAME, else the local address that routes
  // to MASTER_ADDR when that is set and not loopback, else loopback (one machine).
  std::string gloo_ifname;
  std::string gloo_hostname;
  // Gloo: before every collective the ranks exchange a fingerprint (operation, sequence
  // number, dtype, shape, reduce op or root: 184 bytes), so ranks in different collectives, or
  // in one with different tensors, fail at once on every rank, naming what each ran, instead of
  // hanging until the timeout. Costs one small round trip per allreduce, broadcast and barrier
  // (the other collectives needed the sizes anyway); docs/elastic_and_cluster_launch.md gives
  // the measured cost. Off here or with EMBER_COLLECTIVE_FINGERPRINT=0.
  bool fingerprint_collectives = true;
  // NCCL: the CUDA device this rank drives; -1 means rank % device_count().
  int cuda_device = -1;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // `tensor` (contiguous) is replaced by the reduction over ranks.
  virtual std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // `tensor` on every rank becomes root's.
  virtual std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) = 0;
  // Returns one tensor per rank, in rank order; shapes may differ between ranks along dim 0
  // (the other dimensions and the dtype must agree).
  virtual std::vector<Tensor> allgather(const Tensor& tensor) = 0;
  // Gathers into a preallocated buffer, returning at once: output (contiguous, same dtype and
  // device as input) has size() * input.numel() elements, and rank r's input lands at elements
  // [r * n, (r + 1) * n) whatever their shapes. input may be this rank's chunk of output.
  // Every rank passes the same numel; an empty input moves nothing.
  virtual std::shared_ptr<Work> allgather_into(Tensor output, const Tensor& input) = 0;
  // input holds size() equal chunks along dim 0; output receives this rank's reduced chunk.
  virtual std::shared_ptr<Work> reduce_scatter(Tensor output, const Tensor& input, ReduceOp op = ReduceOp::Sum) = 0;
  virtual void barrier() = 0;

  // Byte blobs of any length from every rank (objects serialise themselves to bytes).
  virtual std::vector<Bytes> allgather_bytes(const Bytes& mine) = 0;

 protected:
  int rank_;
  int size_;
};

// Backends call this once per group they create: a PrefixStore "ember_pg<n>" over `store`,
// where n counts the groups this rank created on the store. Ranks create groups in the same
// order, so n agrees between ranks and groups sharing a store never see each other's keys.
std::shared_ptr<Store> group_key_space(const std::shared_ptr<Store>& store, int rank);

// Creates a group of `size` ranks meeting through `store`; backend is "gloo" or "nccl" (the
// latter only in builds with CUDA). Every rank calls it with the same store contents, size and
// backend; several groups may share one store (each creation gets its own key space).
std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                const std::string& backend,
                                                ProcessGroupOptions options = {});

}  // namespace ember::distributed
