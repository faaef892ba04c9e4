// Reducer: the gradient side of DistributedDataParallel. Parameters are grouped into buckets
// (reverse registration order, one dtype/device per bucket, the first about first_bucket_cap_mb,
// the rest about bucket_cap_mb). After the first synchronised pass the layout is rebuilt once
// from the order its gradients really became ready (rank 0's order, so every rank agrees; see
// docs/ddp_communication.md). When the
// last gradient of a bucket has been accumulated, the bucket's gradients are copied into one
// flat buffer (allocated once, reused every step) and all-reduced asynchronously, so the
// communication overlaps the rest of backward. A callback queued on the autograd engine waits
// for every bucket when backward ends, averages and writes the result back into each .grad.
//
// A table that takes row-sparse gradients (Embedding(sparse), core/sparse_grad.h) sends only the
// rows its lookups touched: one all-gather per table after the last bucket is launched, its dense
// part (a tied decoder's, ready early in backward) in a bucket like any gradient.
//
// Buckets are launched strictly in index order on every rank (a ready bucket waits for the
// ones before it), so the collectives match across ranks even when gradients arrive in a
// different order.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/removable_handle.h"
#include "core/sparse_grad.h"
#include "distributed/comm_hooks.h"
#include "distributed/debug_level.h"
#include "distributed/process_group.h"

namespace ember::distributed {

struct ReducerOptions {
  double bucket_cap_mb = 25.0;
  // The first bucket's cap (at most bucket_cap_mb): small, so communication starts early.
  double first_bucket_cap_mb = 1.0;
  // Parameters without a gradient in a pass count as zeros instead of being an error.
  bool find_unused_parameters = false;
  // After a synchronised backward, each .grad is a view into its bucket's buffer: no copy
  // back, and the next pass accumulates straight into the bucket.
  bool gradient_as_bucket_view = false;
  // Every pass uses the same parameters: after the first, the usage all-reduce of
  // find_unused_parameters is skipped, and a pass that breaks the promise is an error.
  bool static_graph = false;
};

// Communication timing, for benchmarks. The span of a step runs from the first bucket's
// launch to the end of the wait at the end of backward; the exposed part is the time
// backward was blocked in that wait, the rest overlapped computation.
struct CommStats {
  int64_t steps = 0;             // synchronised backward passes
  int64_t buckets_reduced = 0;   // all-reduces issued
  int64_t bytes_reduced = 0;
  int64_t usage_reductions = 0;  // find_unused_parameters' all-reduces of usage flags
  int64_t sparse_gathers = 0;    // all-gathers of row-sparse gradients (one per table and pass)
  int64_t sparse_bytes = 0;      // this rank's rows and indices sent by them (also in bytes_reduced)
  double total_comm_ms = 0;      // sum of per-step spans
  double total_exposed_ms = 0;   // sum of per-step waits
  double last_comm_ms = 0;
  double last_exposed_ms = 0;
  double total_hidden_ms() const { return total_comm_ms - total_exposed_ms; }
  // Share of the communication span that overlapped backward (0 before any step).
  double hidden_fraction() const { return total_comm_ms > 0 ? total_hidden_ms() / total_comm_ms : 0.0; }
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  using NamedParameters = std::vector<std::pair<std::string, Tensor>>;

  // Builds the buckets and installs a post-accumulate-grad hook on every parameter. The hooks
  // hold only a weak reference to the Reducer, and destroying it removes them.
  static std::shared_ptr<Reducer> create(NamedParameters params, std::shared_ptr<ProcessGroup> pg,
                                         ReducerOptions options);
  ~Reducer();
  // Removes the hooks from the parameters (idempotent); after it, backward leaves gradients local.
  void remove_hooks();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Off: hooks leave gradients to accumulate locally; the next synchronised pass reduces them.
  void set_sync(bool on) { sync_ = on; }
  bool sync() const { return sync_; }

  // Bytes of each bucket, in launch order.
  std::vector<int64_t> bucket_sizes() const;
  // Parameter names of each bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // Every bucket's reduction goes through `hook` from now on (it averages; see comm_hooks.h).
  // Before the first synchronised backward, once, as torch requires.
  void register_comm_hook(CommHook hook);
  bool has_comm_hook() const { return static_cast<bool>(hook_); }
  // Called with each bucket's parameters once their averaged gradients are written back, in
  // bucket order, while later buckets are still reducing (empty: none). Not with
  // find_unused_parameters.
  using BucketStep = std::function<void(const std::vector<Tensor>&)>;
  void set_bucket_step(BucketStep step);

  // True once the layout has been rebuilt from the first synchronised pass's gradient order.
  bool buckets_rebuilt() const { return rebuilt_; }
  // The order the layout was rebuilt from (rank 0's), as parameter names; empty before.
  std::vector<std::string> gradient_ready_order() const;
  // The gradient order, the layout and the communication figures, as text (what
  // EMBER_DISTRIBUTED_DEBUG prints; docs/ddp_communication.md section 4).
  std::string debug_report() const;

 private:
  using Clock = std::chrono::steady_clock;

  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    int64_t offset = 0;   // in elements, within the bucket buffer
    bool ready = false;   // its gradient arrived in the current pass
    // An Embedding(sparse) table: its lookup rows are all-gathered at the end of backward. A
    // dense part (a tied decoder's) goes through a bucket; dense_slot turns off once the first
    // pass showed it has none.
    bool row_sparse = false;
    bool dense_slot = true;
  };
  struct Bucket {
    DType dtype = DType::f32;
    Device device = Device::cpu();
    std::vector<size_t> params;
    int64_t numel = 0;
    Tensor buffer;        // flat, contiguous, reused across steps
    size_t pending = 0;   // gradients still missing in the current pass
    std::shared_ptr<Work> work;
  };
  struct PassToken;

  Reducer(NamedParameters params, std::shared_ptr<ProcessGroup> pg, ReducerOptions options);
  // Buckets filled in `order` (indices into params_, every one once).
  void build_buckets(const std::vector<size_t>& order);
  // After the first synchronised pass: rank 0's gradient order becomes every rank's layout.
  void rebuild_buckets_from_first_pass();
  // static_graph: this pass must use the parameters the first one did.
  void check_static_graph(const std::vector<size_t>& missing) const;
  void write_back(Param& p);  // the bucket's average into p's .grad
  std::string layout_report() const;
  std::string step_report() const;
  void install_hooks();

  void on_gradient_ready(size_t index);
  void on_sparse_gradient_ready();
  // Every table's rows from every rank, summed and averaged into its row-sparse gradient.
  void reduce_sparse_rows(const std::vector<RowSparseGrad>& local);
  std::vector<Tensor> row_sparse_tensors() const;
  void begin_pass();
  void launch_ready_buckets();
  void launch(size_t bucket);
  void finish_pass();          // the end-of-backward callback
  void abandon_pass() noexcept;  // a pass that failed: drain the work, forget the state
  void wait_all_launched();
  void reset_pass_state();

  Tensor slot(const Param& p) const;  // the parameter's view into its bucket
  bool grad_is_slot(const Param& p) const;

  NamedParameters named_;
  std::shared_ptr<ProcessGroup> pg_;
  ReducerOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<RemovableHandle> hooks_;  // one per parameter

  DebugLevel debug_ = DebugLevel::Off;
  CommHook hook_;
  BucketStep bucket_step_;
  std::vector<size_t> ready_order_;  // this rank's, recorded until the rebuild
  std::vector<size_t> layout_order_;  // rank 0's, which the layout follows after the rebuild
  int ranks_with_other_order_ = 0;
  bool rebuilt_ = false;
  // static_graph, from the first pass: which parameters were missing here, which no rank used.
  std::optional<std::vector<bool>> first_pass_missing_;
  std::vector<float> static_used_flags_;

  bool sync_ = true;
  bool pass_active_ = false;
  size_t next_bucket_ = 0;
  Clock::time_point first_launch_;
  bool launched_any_ = false;
  CommStats stats_;
};

}  // namespace ember::distributed
