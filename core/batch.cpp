#include "core/batch.h"

namespace ember {

const Tensor& Batch::at(const std::string& key) const {
  auto it = fields.find(key);
  EMBER_CHECK(it != fields.end(), "Batch: no field '", key, "'");
  return it->second;
}

Tensor Batch::get(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? Tensor() : it->second;
}

int64_t Batch::size() const {
  for (const auto& [k, t] : fields)
    if (t.defined() && t.dim() > 0) return t.size(0);
  return 0;
}

Batch Batch::to(Device device, bool non_blocking) const {
  Batch out;
  for (const auto& [k, t] : fields) out.fields[k] = t.defined() ? t.to(device, non_blocking) : t;
  return out;
}

Batch Batch::pin_memory() const {
  Batch out;
  for (const auto& [k, t] : fields) out.fields[k] = t.defined() ? t.pin_memory() : t;
  return out;
}

}  // namespace ember
