#include "distributed/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/half.h"
#include "distributed/collective_checks.h"
#include "distributed/collective_fingerprint.h"
#include "distributed/debug_level.h"
#include "distributed/gloo_store_adapter.h"
#include "distributed/socket_util.h"

namespace ember::distributed {
namespace {

using std::chrono::milliseconds;

std::string duration_str(milliseconds t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + "s";
  if (t.count() > 1000) {
    std::ostringstream os;
    os << double(t.count()) / 1000.0 << "s";
    return os.str();
  }
  return std::to_string(t.count()) + "ms";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// True when the job spans several machines, as the launcher's variables tell.
bool job_spans_machines(int size) {
  const std::string local = env_or("LOCAL_WORLD_SIZE", "");
  const int per_machine = local.empty() ? size : std::atoi(local.c_str());
  return per_machine > 0 && per_machine < size;
}

gloo::transport::tcp::attr device_attr(const ProcessGroupOptions& opt, int size) {
  gloo::transport::tcp::attr attr;
  const std::string ifname = opt.gloo_ifname.empty() ? env_or("EMBER_GLOO_IFNAME", "") : opt.gloo_ifname;
  if (!ifname.empty()) {
    attr.iface = ifname;
    return attr;
  }
  std::string host = opt.gloo_hostname.empty() ? env_or("EMBER_GLOO_HOSTNAME", "") : opt.gloo_hostname;
  if (host.empty()) {
    const std::string master = env_or("MASTER_ADDR", "");
    if (!master.empty() && !net::is_loopback_host(master)) {
      host = net::local_address_toward(master);
    } else if (!master.empty() && !net::is_loopback_everywhere(master) && job_spans_machines(size)) {
      // The master's name is loopback only here (Debian's host name): the other machines dial
      // it by its real address, so this rank must listen where they can reach it too.
      host = net::routable_local_address();
    }
  }
  // Every rank is on this machine: each listens on 127.0.0.1, whatever loopback name the
  // master was given (127.0.1.1, ::1, the host name), and the others dial what it publishes.
  attr.hostname = host.empty() ? "127.0.0.1" : host;
  return attr;
}

// Gloo prefixes its messages with "[source.cc:123] "; the user needs only the rest.
std::string strip_source_location(std::string msg) {
  while (!msg.empty() && msg[0] == '[') {
    const size_t close = msg.find("] ");
    if (close == std::string::npos || msg.find(':') > close) break;
    msg = msg.substr(close + 2);
  }
  return msg;
}

// ---- element-wise combiners handed to Gloo: out[i] = a[i] (op) b[i]

struct SumOp { template <typename T> T operator()(T a, T b) const { return a + b; } };
// Max and Min propagate NaN, as torch.maximum does.
struct MaxOp {
  template <typename T> T operator()(T a, T b) const { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
};
struct MinOp {
  template <typename T> T operator()(T a, T b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

template <typename T, typename Op>
void combine(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const Op op;
  for (size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
}

// 16-bit floats travel as their bits and are combined in float.
template <typename H, typename Op>
void combine16(void* out, const void* a, const void* b, size_t n) {
  H* o = static_cast<H*>(out);
  const H* x = static_cast<const H*>(a);
  const H* y = static_cast<const H*>(b);
  const Op op;
  for (size_t i = 0; i < n; ++i) o[i] = H(op(float(x[i]), float(y[i])));
}

template <typename Op>
gloo::AllreduceOptions::Func combiner_for(DType dt) {
  switch (dt) {
    case DType::f32: return &combine<float, Op>;
    case DType::f64: return &combine<double, Op>;
    case DType::f16: return &combine16<Half, Op>;
    case DType::bf16: return &combine16<BFloat16, Op>;
    case DType::i32: return &combine<int32_t, Op>;
    case DType::i64: return &combine<int64_t, Op>;
    default: break;
  }
  EMBER_FAIL("allreduce: dtype ", dt, " is not supported");
}

gloo::AllreduceOptions::Func combiner(DType dt, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return combiner_for<SumOp>(dt);
    case ReduceOp::Max: return combiner_for<MaxOp>(dt);
    case ReduceOp::Min: return combiner_for<MinOp>(dt);
  }
  EMBER_FAIL("allreduce: unknown reduce op");
}

template <typename T>
void divide_in_place(void* data, size_t n, int by) {
  T* p = static_cast<T*>(data);
  const float d = float(by);
  for (size_t i = 0; i < n; ++i) p[i] = T(float(p[i]) / d);
}

void divide(void* data, size_t n, DType dt, int by) {
  switch (dt) {
    case DType::f32: divide_in_place<float>(data, n, by); return;
    case DType::f64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < n; ++i) p[i] /= double(by);
      return;
    }
    case DType::f16: divide_in_place<Half>(data, n, by); return;
    case DType::bf16: divide_in_place<BFloat16>(data, n, by); return;
    default: EMBER_FAIL("allreduce: avg of ", dt, " tensors is not defined");
  }
}

// "[ip]:port" of the socket this rank accepts connections on (the pair's address carries it).
std::string listen_address(gloo::Context& context, int peer) {
  std::string s = context.getPair(peer)->address().str();
  const size_t close = s.find(']');
  if (close == std::string::npos) return s;
  size_t end = close + 1;
  if (end < s.size() && s[end] == ':') {
    ++end;
    while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  }
  return s.substr(0, end);
}

// True when `text` contains `address` ("[ip]:port") not followed by another digit.
bool mentions_address(const std::string& text, const std::string& address) {
  if (address.empty()) return false;
  for (size_t at = text.find(address); at != std::string::npos; at = text.find(address, at + 1)) {
    const size_t end = at + address.size();
    if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

// Gloo writes to sockets without MSG_NOSIGNAL: a peer that died would kill this process with
// SIGPIPE instead of failing the collective. A handler the program installed is left alone.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

bool supported_dtype(DType dt) { return dt != DType::boolean; }

class GlooWork : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Raised inside a collective when the ranks disagree about it; every rank sees the same
// fingerprints and fails alike, so the group stays usable.
struct Disagreement : Error {
  using Error::Error;
};

constexpr int kMaxDims = 16;

}  // namespace

// ---------------------------------------------------------------------------------------------

class ProcessGroupGloo::Impl {
 public:
  Impl(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  ~Impl();

  std::string where(const char* op) const { return collective_where(op, size, rank); }
  void check_tensor(const char* op, const Tensor& t) const;
  // Every rank's fingerprint of the collective being run (just this rank's when the exchange
  // was skipped: fingerprints off, and the collective does not need the others' shapes).
  using Fingerprints = std::vector<CollectiveFingerprint>;
  // Queues `fn` for the worker thread, which first numbers the collective (`mine.seq`) and,
  // when fingerprints are on or the collective needs every rank's shape, exchanges and
  // compares fingerprints.
  std::shared_ptr<Work> enqueue(CollectiveFingerprint mine, std::function<void(const Fingerprints&)> fn);

  // The collectives, as run by the worker thread.
  void run_allreduce(const char* op_name, void* data, size_t n, DType dt, ReduceOp op);
  void run_broadcast(void* data, size_t bytes, int root);
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine);  // size * mine.size()
  void run_allgatherv(const void* in, size_t in_bytes, void* out, const std::vector<size_t>& bytes);
  void run_barrier();
  // Runs one Gloo collective whose options (and so transport buffers) the caller holds. When
  // it fails, Gloo's I/O thread may still be completing sends and receives on the collective's
  // buffers, the user's tensor and the options' own; seen under ThreadSanitizer when a peer
  // exits mid all-reduce. Every connection is closed before the failure propagates (each close
  // waits for its pair's callbacks), so nothing touches those buffers once the options are
  // destroyed and the caller has the error. The group is unusable after a failure anyway.
  template <typename Collective>
  void run_gloo(Collective&& collective);
  // Every rank's fingerprint; a Disagreement (on every rank alike) when they cannot run together.
  Fingerprints agree(const CollectiveFingerprint& mine);

  int rank;
  int size;
  ProcessGroupOptions opt;
  bool fingerprints = true;
  std::shared_ptr<Store> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::vector<std::string> addresses;  // per rank, as Gloo prints peers

 private:
  void run();
  std::string describe_failure(const CollectiveFingerprint& running, const std::string& what);

  struct Task {
    CollectiveFingerprint fingerprint;
    std::function<void(const Fingerprints&)> fn;
    std::shared_ptr<GlooWork> work;
  };
  uint32_t next_tag_ = 1;
  uint64_t executed_ = 0;  // collectives run so far: the same count on every rank
  std::mutex mu_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::string broken_;  // the first failure; the group refuses further work after it
  std::thread worker_;
};

ProcessGroupGloo::Impl::Impl(std::shared_ptr<Store> user_store, int rank_, int size_, ProcessGroupOptions options)
    : rank(rank_), size(size_), opt(std::move(options)) {
  EMBER_CHECK(size >= 1, "ProcessGroupGloo: size must be at least 1, got ", size);
  EMBER_CHECK(rank >= 0 && rank < size, "ProcessGroupGloo: rank ", rank, " is out of range for size ", size);
  EMBER_CHECK(opt.timeout.count() > 0, "ProcessGroupGloo: timeout must be positive, got ", opt.timeout.count(), " ms");
  fingerprints = opt.fingerprint_collectives && collective_fingerprints_enabled_by_env();
  ignore_sigpipe();
  store = group_key_space(user_store, rank);
  const std::string setup = detail::str_cat("ProcessGroupGloo setup (world ", size, ", rank ", rank, ")");

  const auto attr = device_attr(opt, size);
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    EMBER_FAIL(setup, ": cannot open a TCP endpoint on ",
               attr.iface.empty() ? "address '" + attr.hostname + "'" : "interface '" + attr.iface + "'", ": ",
               strip_source_location(e.what()),
               " (set EMBER_GLOO_IFNAME to a network interface or EMBER_GLOO_HOSTNAME to this host's address)");
  }
  store->set_string("joined/" + std::to_string(rank), "1");

  // Everyone must have published an address before Gloo connects: waiting here names the
  // ranks that never came, instead of failing somewhere inside the connection setup.
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
  const auto missing = wait_for_keys(*store, keys, opt.timeout);
  if (!missing.empty()) {
    std::vector<int> absent;
    for (const auto& k : missing) absent.push_back(std::stoi(k.substr(k.find('/') + 1)));
    EMBER_FAIL(setup, ": ", rank_list(absent), absent.size() == 1 ? " did" : " did", " not join within ",
               duration_str(opt.timeout), " (", size - int(absent.size()), " of ", size, " ranks arrived)");
  }

  context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(opt.timeout);
  GlooStoreAdapter adapter(store);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    EMBER_FAIL(setup, ": connecting to the other ranks failed: ", strip_source_location(e.what()));
  }
  // Gloo names a peer by the address it dialled; record every rank's so errors can name ranks.
  const std::string mine = size > 1 ? listen_address(*context, rank == 0 ? 1 : 0) : "";
  store->set_string("listen/" + std::to_string(rank), mine);
  for (int r = 0; r < size; ++r) addresses.push_back(store->get_string("listen/" + std::to_string(r)));
  worker_ = std::thread([this] { run(); });
}

ProcessGroupGloo::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroupGloo::Impl::check_tensor(const char* op, const Tensor& t) const {
  EMBER_CHECK(t.defined(), where(op), ": the tensor is undefined");
  EMBER_CHECK(t.is_cpu(), where(op), ": the gloo backend works on CPU tensors, got a tensor on ", t.device(),
              " (use the nccl backend for CUDA tensors, or move the tensor with .to(Device::cpu()))");
  EMBER_CHECK(t.is_contiguous(), where(op), ": the tensor must be contiguous, got shape ", t.shape(),
              " with strides ", t.strides(), " (call .contiguous() and copy the result back)");
  EMBER_CHECK(supported_dtype(t.dtype()), where(op), ": dtype ", t.dtype(),
              " is not supported (f32, f64, f16, bf16, i32, i64 are)");
}

std::shared_ptr<Work> ProcessGroupGloo::Impl::enqueue(CollectiveFingerprint mine,
                                                      std::function<void(const Fingerprints&)> fn) {
  auto work = std::make_shared<GlooWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{std::move(mine), std::move(fn), work});
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroupGloo::Impl::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        lock.unlock();
        task.work->finish(std::make_exception_ptr(Error(
            where(collective_kind_name(task.fingerprint.kind)) + ": the process group was destroyed before the collective ran")));
        continue;
      }
    }
    CollectiveFingerprint& mine = task.fingerprint;
    const char* op = collective_kind_name(mine.kind);
    std::exception_ptr error;
    if (!broken_.empty()) {
      error = std::make_exception_ptr(
          Error(where(op) + ": the process group is unusable after an earlier failure: " + broken_));
    } else {
      mine.seq = executed_++;
      try {
        // allgather's pieces and allgather_bytes' lengths come from the others' fingerprints,
        // so those two always exchange them (at no extra cost: they needed the sizes anyway).
        const bool needs_shapes = mine.kind == CollectiveKind::allgather || mine.kind == CollectiveKind::allgather_bytes;
        task.fn(fingerprints || needs_shapes ? agree(mine) : Fingerprints{mine});
      } catch (const Disagreement&) {
        error = std::current_exception();
      } catch (const std::exception& e) {
        broken_ = describe_failure(mine, e.what());
        error = std::make_exception_ptr(Error(broken_));
      }
    }
    // Drop the tensors the collective captured before its waiter wakes: memory the caller
    // frees after wait() is then free, not held until this thread's next iteration.
    task.fn = nullptr;
    task.work->finish(error);
  }
}

std::string ProcessGroupGloo::Impl::describe_failure(const CollectiveFingerprint& running, const std::string& what) {
  const char* op = collective_kind_name(running.kind);
  const uint64_t seq = running.seq;
  const std::string detail = strip_source_location(what);
  // First ask the store which ranks are alive to report the same failure: a rank that fails
  // because another one died closes its connections too, so the peer Gloo names may be a
  // bystander. The store may have died with its host; then only Gloo's view is left.
  std::vector<int> silent;
  bool store_answered = false;
  if (size > 1) {
    try {
      const std::string base = "failure/" + std::to_string(seq) + "/";
      store->set_string(base + std::to_string(rank), "1");
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r)
        if (r != rank) keys.push_back(base + std::to_string(r));
      // Long enough for a survivor on a loaded machine to notice the same failure and say so.
      const auto window = std::min<milliseconds>(opt.timeout / 2, milliseconds(3000));
      for (const auto& k : wait_for_keys(*store, keys, window)) silent.push_back(std::stoi(k.substr(base.size())));
      store_answered = true;
    } catch (const std::exception&) {
      silent.clear();
    }
  }
  // Gloo names the peer by address: a lower rank dials a higher one's listening address, so a
  // known address names a higher rank, and an unknown one a lower rank.
  std::vector<int> named;
  for (int r = rank + 1; r < size; ++r)
    if (mentions_address(detail, addresses[size_t(r)])) named.push_back(r);
  if (named.empty() && rank == 1 && detail.find("[") != std::string::npos) named.push_back(0);
  if (size == 2) named = {1 - rank};
  const bool timed_out = detail.find("imed out") != std::string::npos;
  std::string msg = where(op) + ": ";
  if (!silent.empty()) {
    // A survivor that noticed later than the others is listed too, hence "or stuck".
    msg += timed_out ? rank_list(silent) + " did not respond within " + duration_str(opt.timeout)
                     : "no word from " + rank_list(silent) + " (exited, killed or stuck)";
  } else if (!named.empty() && !store_answered) {
    msg += timed_out ? rank_list(named) + " did not respond within " + duration_str(opt.timeout)
                     : "lost the connection to " + rank_list(named);
  } else {
    msg += timed_out ? "a peer did not respond within " + duration_str(opt.timeout) : "the collective failed";
  }
  // Name the collective this rank was in: a peer that left the loop early (a collective
  // called under is_main_process) shows as the one collective nobody else reached.
  return msg + " (" + detail + "), while in " + running.describe();
}

template <typename Collective>
void ProcessGroupGloo::Impl::run_gloo(Collective&& collective) {
  try {
    collective();
  } catch (...) {
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // A pair that cannot even close cleanly is closed for good: nothing more to wait for.
    }
    throw;
  }
}

void ProcessGroupGloo::Impl::run_allreduce(const char* op_name, void* data, size_t n, DType dt, ReduceOp op) {
  if (n == 0) return;
  if (size > 1) {
    gloo::AllreduceOptions o(context);
    switch (dtype_size(dt)) {
      case 2: o.setOutput(static_cast<uint16_t*>(data), n); break;
      case 4: o.setOutput(static_cast<uint32_t*>(data), n); break;
      case 8: o.setOutput(static_cast<uint64_t*>(data), n); break;
      default: EMBER_FAIL(where(op_name), ": dtype ", dt, " is not supported");
    }
    o.setReduceFunction(combiner(dt, op));
    o.setTag(next_tag_++);
    o.setTimeout(opt.timeout);
    run_gloo([&] { gloo::allreduce(o); });
  }
  if (op == ReduceOp::Avg) divide(data, n, dt, size);
}

void ProcessGroupGloo::Impl::run_broadcast(void* data, size_t bytes, int root) {
  if (bytes == 0 || size == 1) return;
  gloo::BroadcastOptions o(context);
  o.setOutput(static_cast<uint8_t*>(data), bytes);
  o.setRoot(root);
  o.setTag(next_tag_++);
  o.setTimeout(opt.timeout);
  run_gloo([&] { gloo::broadcast(o); });
}

std::vector<int64_t> ProcessGroupGloo::Impl::exchange(const std::vector<int64_t>& mine) {
  std::vector<int64_t> all(mine.size() * size_t(size));
  if (size == 1) return mine;
  std::vector<int64_t> in = mine;
  gloo::AllgatherOptions o(context);
  o.setInput(in.data(), in.size());
  o.setOutput(all.data(), all.size());
  o.setTag(next_tag_++);
  o.setTimeout(opt.timeout);
  run_gloo([&] { gloo::allgather(o); });
  return all;
}

ProcessGroupGloo::Impl::Fingerprints ProcessGroupGloo::Impl::agree(const CollectiveFingerprint& mine) {
  const auto all = exchange(mine.encode());
  Fingerprints fps;
  for (int r = 0; r < size; ++r) fps.push_back(CollectiveFingerprint::decode(&all[size_t(r) * CollectiveFingerprint::kEncodedSize]));
  if (auto mismatch = fingerprint_mismatch(where(collective_kind_name(mine.kind)), fps)) throw Disagreement(*mismatch);
  return fps;
}

void ProcessGroupGloo::Impl::run_allgatherv(const void* in, size_t in_bytes, void* out,
                                            const std::vector<size_t>& bytes) {
  size_t total = 0;
  for (size_t b : bytes) total += b;
  if (total == 0) return;
  if (size == 1) {
    std::memcpy(out, in, in_bytes);
    return;
  }
  gloo::AllgathervOptions o(context);
  // Gloo wants a buffer even for an empty contribution.
  uint8_t dummy = 0;
  o.setInput(in_bytes ? static_cast<uint8_t*>(const_cast<void*>(in)) : &dummy, in_bytes);
  o.setOutput(static_cast<uint8_t*>(out), bytes);
  o.setTag(next_tag_++);
  o.setTimeout(opt.timeout);
  run_gloo([&] { gloo::allgatherv(o); });
}

void ProcessGroupGloo::Impl::run_barrier() {
  if (size == 1) return;
  gloo::BarrierOptions o(context);
  o.setTag(next_tag_++);
  o.setTimeout(opt.timeout);
  run_gloo([&] { gloo::barrier(o); });
}

// ---------------------------------------------------------------------------------------------

namespace {

CollectiveFingerprint fingerprint_of(CollectiveKind kind, const Tensor& t, int64_t extra = 0) {
  CollectiveFingerprint f;
  f.kind = kind;
  f.dtype = t.dtype();
  f.shape = t.shape();
  f.numel = t.numel();
  f.extra = extra;
  return f;
}

}  // namespace

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>(std::move(store), rank, size, std::move(options))) {}

ProcessGroupGloo::~ProcessGroupGloo() = default;

std::chrono::milliseconds ProcessGroupGloo::timeout() const { return impl_->opt.timeout; }
std::string ProcessGroupGloo::address() const { return impl_->addresses[size_t(rank_)]; }

std::shared_ptr<Work> ProcessGroupGloo::allreduce(Tensor tensor, ReduceOp op) {
  impl_->check_tensor("allreduce", tensor);
  check_reduce_op_dtype(impl_->where("allreduce"), op, tensor);
  Impl* impl = impl_.get();
  return impl->enqueue(fingerprint_of(CollectiveKind::allreduce, tensor, int64_t(op)),
                       [impl, tensor, op](const Impl::Fingerprints&) {
                         impl->run_allreduce("allreduce", tensor.raw_data(), size_t(tensor.numel()), tensor.dtype(), op);
                       });
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(Tensor tensor, int root) {
  impl_->check_tensor("broadcast", tensor);
  check_root(impl_->where("broadcast"), root, size_);
  Impl* impl = impl_.get();
  return impl->enqueue(fingerprint_of(CollectiveKind::broadcast, tensor, root),
                       [impl, tensor, root](const Impl::Fingerprints&) {
                         impl->run_broadcast(tensor.raw_data(), size_t(tensor.numel()) * tensor.element_size(), root);
                       });
}

std::vector<Tensor> ProcessGroupGloo::allgather(const Tensor& tensor) {
  impl_->check_tensor("allgather", tensor);
  EMBER_CHECK(tensor.dim() <= kMaxDims, impl_->where("allgather"), ": tensors of more than ", kMaxDims,
              " dimensions are not supported, got shape ", tensor.shape());
  Impl* impl = impl_.get();
  std::vector<Tensor> result;
  impl->enqueue(fingerprint_of(CollectiveKind::allgather, tensor), [impl, tensor, &result](const Impl::Fingerprints& all) {
    // The fingerprints (already checked to agree but in dim 0) carry every rank's shape.
    std::vector<Shape> shapes;
    for (const auto& f : all) shapes.push_back(f.shape);
    // Gather everything into one buffer; each rank's piece is a view of it.
    const size_t elem = tensor.element_size();
    std::vector<size_t> bytes = allgather_counts(shapes);
    for (size_t& b : bytes) b *= elem;
    Tensor out = make_tensor(allgather_output_shape(tensor.shape(), shapes), tensor.dtype(), Device::cpu());
    impl->run_allgatherv(tensor.raw_data(), size_t(tensor.numel()) * elem, out.raw_data(), bytes);
    result = split_allgather_output(out, shapes);
  })->wait();
  return result;
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter(Tensor output, const Tensor& input, ReduceOp op) {
  const char* name = "reduce_scatter";
  impl_->check_tensor(name, input);
  impl_->check_tensor(name, output);
  check_reduce_scatter(impl_->where(name), output, input, op, size_);
  Impl* impl = impl_.get();
  const int r = rank_;
  return impl->enqueue(fingerprint_of(CollectiveKind::reduce_scatter, input, int64_t(op)),
                       [impl, output, input, op, r, name](const Impl::Fingerprints&) {
                         Tensor all = input.clone();
                         impl->run_allreduce(name, all.raw_data(), size_t(all.numel()), all.dtype(), op);
                         const size_t chunk_bytes = size_t(output.numel()) * output.element_size();
                         if (chunk_bytes)
                           std::memcpy(output.raw_data(),
                                       static_cast<const uint8_t*>(all.raw_data()) + size_t(r) * chunk_bytes, chunk_bytes);
                       });
}

std::shared_ptr<Work> ProcessGroupGloo::allgather_into(Tensor output, const Tensor& input) {
  const char* name = "allgather_into";
  impl_->check_tensor(name, input);
  impl_->check_tensor(name, output);
  check_allgather_into(impl_->where(name), output, input, size_);
  Impl* impl = impl_.get();
  const int n = size_;
  return impl->enqueue(fingerprint_of(CollectiveKind::allgather_into, input), [impl, output, input, n](const Impl::Fingerprints&) {
    const size_t bytes = size_t(input.numel()) * input.element_size();
    if (bytes == 0) return;
    // Gloo copies this rank's piece into output while it still reads the input: an input that
    // overlaps output (this rank's chunk of a sharded buffer) is read from a copy.
    const Tensor src = bytes_overlap(input, output) ? input.clone() : input;
    impl->run_allgatherv(src.raw_data(), bytes, output.raw_data(), std::vector<size_t>(size_t(n), bytes));
  });
}

void ProcessGroupGloo::barrier() {
  Impl* impl = impl_.get();
  CollectiveFingerprint mine;
  mine.kind = CollectiveKind::barrier;
  impl->enqueue(mine, [impl](const Impl::Fingerprints&) { impl->run_barrier(); })->wait();
}

std::vector<Bytes> ProcessGroupGloo::allgather_bytes(const Bytes& mine) {
  Impl* impl = impl_.get();
  CollectiveFingerprint fp;
  fp.kind = CollectiveKind::allgather_bytes;
  fp.numel = int64_t(mine.size());
  fp.shape = {fp.numel};
  std::vector<Bytes> result;
  impl->enqueue(fp, [impl, &mine, &result](const Impl::Fingerprints& all) {
    std::vector<size_t> bytes;
    size_t total = 0;
    for (const auto& f : all) bytes.push_back(size_t(f.numel)), total += size_t(f.numel);
    std::vector<uint8_t> out(total);
    impl->run_allgatherv(mine.data(), mine.size(), out.data(), bytes);
    size_t at = 0;
    for (size_t b : bytes) {
      result.emplace_back(out.begin() + long(at), out.begin() + long(at + b));
      at += b;
    }
  })->wait();
  return result;
}

}  // namespace ember::distributed
