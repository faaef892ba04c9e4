#include "distributed/nccl/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "distributed/collective_checks.h"
#include "distributed/gloo_store_adapter.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::distributed {
namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string duration_str(milliseconds t) {
  return t.count() % 1000 == 0 ? std::to_string(t.count() / 1000) + "s" : std::to_string(t.count()) + "ms";
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: break;
  }
  EMBER_FAIL("nccl: dtype ", dt, " is not supported (f32, f64, f16, bf16, i32, i64 are)");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace

class ProcessGroupNCCL::Impl {
 public:
  int rank = 0;
  int size = 1;
  int device = 0;
  ProcessGroupOptions opt;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::mutex mu;
  std::string broken;  // the first failure
  bool aborted = false;

  std::string where(const char* op) const { return collective_where(op, size, rank); }

  [[noreturn]] void fail(const char* op, const std::string& why) {
    if (broken.empty()) broken = where(op) + ": " + why;
    abort_comm();
    EMBER_FAIL(broken);
  }

  void abort_comm() {
    if (comm && !aborted) {
      (void)ncclCommAbort(comm);
      aborted = true;
    }
  }

  void check_usable(const char* op) const {
    EMBER_CHECK(broken.empty(), where(op), ": the process group is unusable after an earlier failure: ", broken);
  }

  // A non-blocking communicator may answer ncclInProgress; wait until the call really took,
  // or fail past the deadline.
  void settle(const char* op, ncclResult_t r, clock_type::time_point deadline) {
    while (r == ncclInProgress) {
      if (clock_type::now() > deadline)
        fail(op, "NCCL did not accept the call within " + duration_str(opt.timeout) + " (a peer rank is missing?)");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm, &async);
      r = async;
    }
    if (r != ncclSuccess) fail(op, nccl_error(r));
  }

  std::string nccl_error(ncclResult_t r) const {
    std::string s = std::string("NCCL error: ") + ncclGetErrorString(r);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) s += std::string(" (") + last + ")";
    return s;
  }

  // Blocks until `done` fired, watching the communicator; aborts past the deadline.
  void wait_event(const char* op, cudaEvent_t done, clock_type::time_point deadline) {
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail(op, std::string("CUDA error while waiting: ") + cudaGetErrorString(q));
      }
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) fail(op, nccl_error(async));
      if (clock_type::now() > deadline)
        fail(op, "did not complete within " + duration_str(opt.timeout) +
                     "; the communicator was aborted (a peer rank died or did not call " + op + ")");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  void check_tensor(const char* op, const Tensor& t) const {
    EMBER_CHECK(t.defined(), where(op), ": the tensor is undefined");
    EMBER_CHECK(t.is_cuda(), where(op), ": the nccl backend works on CUDA tensors, got a tensor on ", t.device(),
                " (use the gloo backend for CPU tensors)");
    EMBER_CHECK(t.device().index == device, where(op), ": the tensor is on ", t.device(), " but this rank drives cuda:",
                device);
    EMBER_CHECK(t.is_contiguous(), where(op), ": the tensor must be contiguous, got shape ", t.shape(), " with strides ",
                t.strides());
    (void)nccl_type(t.dtype());
  }
};

namespace {

// A collective queued on the group's stream; `keep` holds its tensors alive until it finished.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<ProcessGroupNCCL::Impl> pg, const char* op, std::vector<Tensor> keep)
      : pg_(std::move(pg)), op_(op), keep_(std::move(keep)), deadline_(clock_type::now() + pg_->opt.timeout) {
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclWork() override {
    if (done_) (void)cudaEventDestroy(done_);
  }
  cudaEvent_t event() const { return done_; }

  void wait() override {
    std::lock_guard<std::mutex> lock(pg_->mu);
    if (!finished_) {
      cuda::DeviceGuard guard(Device::cuda(pg_->device), op_);
      pg_->wait_event(op_, done_, deadline_);
      finished_ = true;
      // Later work on the caller's stream must see the result.
      EMBER_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_, 0));
      keep_.clear();
    }
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(pg_->mu);
    return finished_ || cudaEventQuery(done_) == cudaSuccess;
  }

 private:
  std::shared_ptr<ProcessGroupNCCL::Impl> pg_;
  const char* op_;
  std::vector<Tensor> keep_;
  clock_type::time_point deadline_;
  cudaEvent_t done_ = nullptr;
  bool finished_ = false;
};

// Orders the group's stream after what the caller queued so far.
void follow_caller(cudaStream_t stream) {
  cudaEvent_t ready = nullptr;
  EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  EMBER_CUDA_CHECK(cudaEventRecord(ready, cuda::current_stream()));
  const cudaError_t e = cudaStreamWaitEvent(stream, ready, 0);
  (void)cudaEventDestroy(ready);  // released once the wait is satisfied
  EMBER_CUDA_CHECK(e);
}

}  // namespace

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> user_store, int rank, int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size), impl_(std::make_shared<Impl>()) {
  Impl& I = *impl_;
  I.rank = rank;
  I.size = size;
  I.opt = options;
  const std::string setup = detail::str_cat("ProcessGroupNCCL setup (world ", size, ", rank ", rank, ")");
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, setup, ": rank ", rank, " is out of range for size ", size);
  cuda::require_available("ProcessGroupNCCL");
  I.device = options.cuda_device >= 0 ? options.cuda_device : rank % cuda::device_count();
  cuda::DeviceGuard guard(Device::cuda(I.device), "ProcessGroupNCCL");
  auto store = group_key_space(user_store, rank);

  store->set_string("joined/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
  const auto missing = wait_for_keys(*store, keys, options.timeout);
  if (!missing.empty()) {
    std::string list;
    for (const auto& k : missing) list += (list.empty() ? "" : ", ") + k.substr(k.find('/') + 1);
    EMBER_FAIL(setup, ": rank(s) ", list, " did not join within ", duration_str(options.timeout));
  }

  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    EMBER_CHECK(r == ncclSuccess, setup, ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
    store->set("nccl_id", Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    EMBER_CHECK(wait_for_keys(*store, {"nccl_id"}, options.timeout).empty(), setup,
                ": rank 0 did not publish the NCCL id within ", duration_str(options.timeout));
    const Bytes b = store->get("nccl_id");
    EMBER_CHECK(b.size() == sizeof(id), setup, ": the NCCL id in the store has ", b.size(), " bytes, expected ",
                sizeof(id));
    std::memcpy(&id, b.data(), sizeof(id));
  }

  // Non-blocking, so that a rank that never arrives becomes a timeout instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = clock_type::now() + options.timeout;
  ncclResult_t r = ncclCommInitRankConfig(&I.comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) EMBER_FAIL(setup, ": ncclCommInitRank failed: ", I.nccl_error(r));
  try {
    I.settle("ProcessGroupNCCL setup", r, deadline);
  } catch (const Error&) {
    EMBER_FAIL(setup, ": ", I.broken);
  }
  EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking));
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  Impl& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mu);
  if (I.stream) {
    // Give queued collectives their time; a stuck one means the communicator must be aborted.
    cudaEvent_t drained = nullptr;
    bool idle = false;
    if (!I.broken.empty() || cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) != cudaSuccess) {
      idle = false;
    } else {
      (void)cudaEventRecord(drained, I.stream);
      try {
        I.wait_event("ProcessGroupNCCL shutdown", drained, clock_type::now() + I.opt.timeout);
        idle = true;
      } catch (const Error&) {
        idle = false;
      }
      (void)cudaEventDestroy(drained);
    }
    if (!idle) I.abort_comm();
  }
  if (I.comm && !I.aborted) (void)ncclCommDestroy(I.comm);
  if (I.stream) (void)cudaStreamDestroy(I.stream);
}

int ProcessGroupNCCL::cuda_device() const { return impl_->device; }

namespace {

// Runs `issue` on the group's stream after the caller's work and returns the Work for it.
template <typename Issue>
std::shared_ptr<Work> launch(const std::shared_ptr<ProcessGroupNCCL::Impl>& pg, const char* op,
                             std::vector<Tensor> keep, Issue&& issue) {
  auto& I = *pg;
  std::lock_guard<std::mutex> lock(I.mu);
  I.check_usable(op);
  cuda::DeviceGuard guard(Device::cuda(I.device), op);
  // The tensors are used on the group's stream: their memory must not be handed out again on
  // the caller's stream before the collective finished, even if the Work is dropped unwaited.
  // An empty tensor has no memory to protect (and NCCL moves nothing for it).
  for (const Tensor& t : keep)
    if (t.defined() && t.is_cuda() && t.numel() > 0) cuda::record_stream(t, I.stream);
  auto work = std::make_shared<NcclWork>(pg, op, std::move(keep));
  follow_caller(I.stream);
  I.settle(op, issue(I.comm, I.stream), clock_type::now() + I.opt.timeout);
  EMBER_CUDA_CHECK(cudaEventRecord(work->event(), I.stream));
  return work;
}

}  // namespace

std::shared_ptr<Work> ProcessGroupNCCL::allreduce(Tensor tensor, ReduceOp op) {
  impl_->check_tensor("allreduce", tensor);
  check_reduce_op_dtype(impl_->where("allreduce"), op, tensor);
  return launch(impl_, "allreduce", {tensor}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(tensor.raw_data(), tensor.raw_data(), size_t(tensor.numel()), nccl_type(tensor.dtype()),
                         nccl_op(op), comm, s);
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::broadcast(Tensor tensor, int root) {
  impl_->check_tensor("broadcast", tensor);
  check_root(impl_->where("broadcast"), root, size_);
  return launch(impl_, "broadcast", {tensor}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(tensor.raw_data(), tensor.raw_data(), size_t(tensor.numel()), nccl_type(tensor.dtype()), root,
                         comm, s);
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter(Tensor output, const Tensor& input, ReduceOp op) {
  const char* name = "reduce_scatter";
  impl_->check_tensor(name, input);
  impl_->check_tensor(name, output);
  check_reduce_scatter(impl_->where(name), output, input, op, size_);
  return launch(impl_, name, {output, input}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclReduceScatter(input.raw_data(), output.raw_data(), size_t(output.numel()), nccl_type(input.dtype()),
                             nccl_op(op), comm, s);
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::allgather_into(Tensor output, const Tensor& input) {
  const char* name = "allgather_into";
  impl_->check_tensor(name, input);
  impl_->check_tensor(name, output);
  check_allgather_into(impl_->where(name), output, input, size_);
  const size_t n = size_t(input.numel());
  // NCCL gathers in place only when input is exactly this rank's chunk; any other overlap
  // is read from a copy (made on the caller's stream, which the group's stream follows).
  const size_t chunk_bytes = n * input.element_size();
  const bool own_chunk = n > 0 && static_cast<const uint8_t*>(input.raw_data()) ==
                                      static_cast<const uint8_t*>(output.raw_data()) + size_t(rank_) * chunk_bytes;
  const Tensor src = !own_chunk && bytes_overlap(input, output) ? input.clone() : input;
  return launch(impl_, name, {output, src}, [&](ncclComm_t comm, cudaStream_t s) {
    if (n == 0) return ncclSuccess;  // nothing to move
    return ncclAllGather(src.raw_data(), output.raw_data(), n, nccl_type(src.dtype()), comm, s);
  });
}

namespace {

// Gathers `in` (count_r elements of `type` on rank r) into `out` back to back: one broadcast
// per rank inside a group call, since NCCL has no allgatherv.
ncclResult_t gather_uneven(const void* in, void* out, const std::vector<size_t>& counts, size_t elem,
                           ncclDataType_t type, int rank, ncclComm_t comm, cudaStream_t s) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  size_t offset = 0;
  for (size_t peer = 0; peer < counts.size(); ++peer) {
    char* dst = static_cast<char*>(out) + offset * elem;
    const void* src = int(peer) == rank ? in : dst;
    r = ncclBroadcast(src, dst, counts[peer], type, int(peer), comm, s);
    if (r != ncclSuccess && r != ncclInProgress) break;
    offset += counts[peer];
  }
  const ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess && r != ncclInProgress ? r : end;
}

}  // namespace

std::vector<Bytes> ProcessGroupNCCL::allgather_bytes(const Bytes& mine) {
  // Lengths first (int64 per rank), then the bytes; both through device buffers.
  const Device dev = Device::cuda(impl_->device);
  Tensor len = make_tensor({1}, DType::i64, dev);
  const int64_t my_len = int64_t(mine.size());
  {
    cuda::DeviceGuard guard(dev, "allgather_bytes");
    EMBER_CUDA_CHECK(cudaMemcpy(len.raw_data(), &my_len, sizeof(my_len), cudaMemcpyHostToDevice));
  }
  Tensor lens = make_tensor({size_}, DType::i64, dev);
  launch(impl_, "allgather_bytes", {len, lens}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(len.raw_data(), lens.raw_data(), 1, ncclInt64, comm, s);
  })->wait();
  const std::vector<int64_t> lengths = lens.to_vector<int64_t>();
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  Tensor in_bytes = make_tensor({int64_t(std::max<size_t>(mine.size(), 1))}, DType::boolean, dev);
  Tensor out = make_tensor({int64_t(std::max<size_t>(total, 1))}, DType::boolean, dev);
  {
    cuda::DeviceGuard guard(dev, "allgather_bytes");
    if (!mine.empty())
      EMBER_CUDA_CHECK(cudaMemcpy(in_bytes.raw_data(), mine.data(), mine.size(), cudaMemcpyHostToDevice));
  }
  const int r = rank_;
  launch(impl_, "allgather_bytes", {in_bytes, out}, [&](ncclComm_t comm, cudaStream_t s) {
    return gather_uneven(in_bytes.raw_data(), out.raw_data(), counts, 1, ncclUint8, r, comm, s);
  })->wait();
  std::vector<uint8_t> host(total);
  if (total) {
    cuda::DeviceGuard guard(dev, "allgather_bytes");
    EMBER_CUDA_CHECK(cudaMemcpy(host.data(), out.raw_data(), total, cudaMemcpyDeviceToHost));
  }
  std::vector<Bytes> result;
  size_t at = 0;
  for (size_t c : counts) {
    result.emplace_back(host.begin() + long(at), host.begin() + long(at + c));
    at += c;
  }
  return result;
}

std::vector<Tensor> ProcessGroupNCCL::allgather(const Tensor& tensor) {
  impl_->check_tensor("allgather", tensor);
  // Shapes first (small, through allgather_bytes), then the data.
  std::vector<int64_t> fingerprint = {int64_t(tensor.dtype()), tensor.dim()};
  for (int64_t d = 0; d < tensor.dim(); ++d) fingerprint.push_back(tensor.size(d));
  Bytes mine(fingerprint.size() * sizeof(int64_t));
  std::memcpy(mine.data(), fingerprint.data(), mine.size());
  const auto all = allgather_bytes(mine);
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const auto& b : all) {
    std::vector<int64_t> f(b.size() / sizeof(int64_t));
    std::memcpy(f.data(), b.data(), f.size() * sizeof(int64_t));
    shapes.emplace_back(f.begin() + 2, f.end());
    dtypes.push_back(DType(f[0]));
  }
  if (auto mismatch = allgather_mismatch(impl_->where("allgather"), tensor.shape(), tensor.dtype(), shapes, dtypes))
    EMBER_FAIL(*mismatch);
  const std::vector<size_t> counts = allgather_counts(shapes);
  Tensor out = make_tensor(allgather_output_shape(tensor.shape(), shapes), tensor.dtype(), tensor.device());
  const int r = rank_;
  launch(impl_, "allgather", {tensor, out}, [&](ncclComm_t comm, cudaStream_t s) {
    return gather_uneven(tensor.raw_data(), out.raw_data(), counts, tensor.element_size(), nccl_type(tensor.dtype()),
                         r, comm, s);
  })->wait();
  return split_allgather_output(out, shapes);
}

void ProcessGroupNCCL::barrier() {
  Tensor one = make_tensor({1}, DType::f32, Device::cuda(impl_->device));
  // The value is irrelevant: finishing the allreduce means every rank arrived.
  launch(impl_, "barrier", {one}, [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, comm, s);
  })->wait();
}

}  // namespace ember::distributed
