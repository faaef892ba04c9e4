// PreparedModel: what Accelerator::prepare returns for a model. It is the model's own
// shared_ptr (it converts to one, compares equal to it and is accepted wherever one is), and
// its `->` runs the call under the Accelerator's autocast, as Accelerate wraps a prepared
// model's forward in autocast: with mixed_precision "bf16", `m->forward(batch)` runs its
// matrix products in bf16 with no `acc.autocast()` scope around it.
//
//   auto [m, o, l] = acc.prepare(model, opt, loader);
//   auto out = m->forward(batch);   // under autocast for the whole call
//   acc.backward(out.loss);         // backward never autocasts
//
// Only calls made through `->` are autocast: `*m`, `m.get()`, the original shared_ptr and
// copies kept as a plain std::shared_ptr<M> reach the model directly. An autocast scope opened
// inside the model, or one disabled around `m->`, is overridden for the call, as in
// Accelerate. Accelerator::unwrap_model(m, false) gives a handle that does not autocast.
#pragma once
#include <memory>
#include <optional>
#include <utility>

#include "core/autocast.h"
#include "core/device.h"
#include "core/dtype.h"

namespace ember::distributed {

// The autocast a prepared model's calls run under (none when not enabled).
struct ForwardAutocast {
  bool enabled = false;
  DeviceType device = DeviceType::CPU;
  DType dtype = DType::bf16;
};

template <typename M>
class PreparedModel : public std::shared_ptr<M> {
 public:
  // The object `->` returns: it holds the autocast scope until the end of the full expression
  // (the whole `m->forward(...)` call), then closes it.
  class Call {
   public:
    M* operator->() const { return model_; }

   private:
    friend class PreparedModel;
    Call(M* model, const ForwardAutocast& autocast) : model_(model) {
      if (autocast.enabled) scope_.emplace(autocast.device, autocast.dtype);
    }
    M* model_;
    std::optional<AutocastGuard> scope_;
  };

  PreparedModel() = default;
  PreparedModel(std::shared_ptr<M> model, ForwardAutocast autocast)
      : std::shared_ptr<M>(std::move(model)), autocast_(autocast) {}

  Call operator->() const { return Call(this->get(), autocast_); }
  const ForwardAutocast& forward_autocast() const { return autocast_; }

 private:
  ForwardAutocast autocast_;
};

}  // namespace ember::distributed
