// The Reducer's debug report: gradient order, bucket layout, communication figures
// (EMBER_DISTRIBUTED_DEBUG; docs/ddp_communication.md section 4).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/reducer.h"

namespace ember::distributed {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (size_t k = 0; k < names.size(); ++k) out += (k ? ", " : "") + names[k];
  return out;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string size_text(int64_t bytes) {
  return bytes >= 1024 * 1024 ? fixed(double(bytes) / (1024.0 * 1024.0), 2) + " MB" : fixed(double(bytes) / 1024.0, 1) + " KB";
}

}  // namespace

std::vector<std::string> Reducer::gradient_ready_order() const {
  std::vector<std::string> out;
  for (size_t i : layout_order_) out.push_back(params_[i].name);
  return out;
}

std::string Reducer::layout_report() const {
  std::ostringstream os;
  os << "DistributedDataParallel rank " << pg_->rank() << " of " << pg_->size() << ": " << params_.size()
     << " parameters, " << buckets_.size() << " bucket" << (buckets_.size() == 1 ? "" : "s")
     << (rebuilt_ ? " (rebuilt from the first pass's gradient order)" : " (reverse registration order)")
     << (options_.static_graph ? ", static_graph" : "") << (hook_ ? ", comm hook" : "") << "\n";
  if (rebuilt_) {
    os << "  gradient-ready order (first pass, rank 0): " << joined(gradient_ready_order()) << "\n";
    if (ranks_with_other_order_ > 0)
      os << "  " << ranks_with_other_order_ << " rank" << (ranks_with_other_order_ == 1 ? "" : "s")
         << " saw another order; rank 0's is used\n";
  }
  const auto names = bucket_parameter_names();
  const auto sizes = bucket_sizes();
  for (size_t b = 0; b < buckets_.size(); ++b)
    os << "  bucket " << b << ": " << size_text(sizes[b]) << ", " << names[b].size()
       << " parameter" << (names[b].size() == 1 ? "" : "s") << ": " << joined(names[b]) << "\n";
  for (const Param& p : params_)
    if (p.row_sparse)
      os << "  row-sparse table " << p.name << ": lookup rows all-gathered after the last bucket"
         << (p.dense_slot ? ", its dense part in a bucket" : ", no dense part") << "\n";
  return os.str();
}

std::string Reducer::step_report() const {
  auto percent = [](double hidden, double span) { return span > 0 ? fixed(100.0 * hidden / span, 0) : "0"; };
  std::ostringstream os;
  os << "DistributedDataParallel rank " << pg_->rank() << " step " << stats_.steps << ": communication "
     << fixed(stats_.last_comm_ms, 1) << " ms, exposed " << fixed(stats_.last_exposed_ms, 1) << " ms, hidden "
     << percent(stats_.last_comm_ms - stats_.last_exposed_ms, stats_.last_comm_ms) << "%\n";
  return os.str();
}

std::string Reducer::debug_report() const {
  std::ostringstream os;
  os << layout_report();
  if (stats_.steps > 0) {
    os << "  last " << step_report().substr(step_report().find("step "));
    os << "  total over " << stats_.steps << " steps: communication " << fixed(stats_.total_comm_ms, 1)
       << " ms, exposed " << fixed(stats_.total_exposed_ms, 1) << " ms, hidden "
       << fixed(100.0 * stats_.hidden_fraction(), 0) << "%, " << stats_.bytes_reduced << " bytes reduced\n";
  }
  return os.str();
}

}  // namespace ember::distributed
