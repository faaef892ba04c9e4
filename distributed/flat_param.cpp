#include "distributed/flat_param.h"

#include <algorithm>
#include <functional>
#include <map>

namespace ember::distributed {
namespace {

// Is module path `a` the module `p` or one of its ancestors ("" is everyone's)?
bool is_ancestor_or_self(const std::string& a, const std::string& p) {
  if (a.empty() || a == p) return true;
  return p.size() > a.size() && p.compare(0, a.size(), a) == 0 && p[a.size()] == '.';
}

int64_t direct_trainable_params(nn::Module& m) {
  int64_t n = 0;
  for (auto& [name, t] : m.named_parameters(false))
    if (t.requires_grad()) n += t.numel();
  return n;
}

}  // namespace

std::pair<int64_t, int64_t> UnitLayout::overlap(size_t i, int64_t begin, int64_t end) const {
  const FlatParamEntry& e = params[i];
  const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
  if (hi <= lo) return {0, 0};
  return {lo - e.offset, hi - lo};
}

std::vector<std::string> wrapped_module_paths(nn::Module& model, const FSDPOptions& options) {
  std::vector<std::string> out;
  switch (options.auto_wrap_policy) {
    case AutoWrapPolicy::NO_WRAP:
      return out;
    case AutoWrapPolicy::TRANSFORMER_BASED_WRAP: {
      EMBER_CHECK(!options.transformer_layer_cls_to_wrap.empty(),
                  "sharded data parallel: auto_wrap_policy TRANSFORMER_BASED_WRAP needs transformer_layer_cls_to_wrap "
                  "(module type names such as \"BertLayer\"), or choose SIZE_BASED_WRAP or NO_WRAP");
      const auto& names = options.transformer_layer_cls_to_wrap;
      for (auto& [path, m] : model.named_modules())
        if (!path.empty() && std::find(names.begin(), names.end(), m->type_name()) != names.end()) out.push_back(path);
      return out;
    }
    case AutoWrapPolicy::SIZE_BASED_WRAP: {
      EMBER_CHECK(options.min_num_params > 0, "sharded data parallel: min_num_params must be positive, got ",
                  options.min_num_params);
      // Bottom-up: a module's count is its own parameters plus what its children left unwrapped.
      std::function<int64_t(nn::Module&, const std::string&)> visit = [&](nn::Module& m, const std::string& path) {
        int64_t left = direct_trainable_params(m);
        for (auto& [name, child] : m.named_children())
          left += visit(*child, path.empty() ? name : path + "." + name);
        if (!path.empty() && left >= options.min_num_params) {
          out.push_back(path);
          return int64_t(0);
        }
        return left;
      };
      visit(model, "");
      // Parents before children, as named_modules lists them.
      std::vector<std::string> ordered;
      for (auto& [path, m] : model.named_modules())
        if (std::find(out.begin(), out.end(), path) != out.end()) ordered.push_back(path);
      return ordered;
    }
  }
  return out;
}

std::vector<UnitLayout> plan_units(nn::Module& model, const FSDPOptions& options, int world_size) {
  EMBER_CHECK(world_size >= 1, "sharded data parallel: world size must be at least 1, got ", world_size);
  const std::vector<std::string> wrapped = wrapped_module_paths(model, options);

  // Every module path that holds each parameter directly (tied weights have several).
  std::map<const TensorImpl*, std::vector<std::string>> holders;
  for (auto& [path, m] : model.named_modules())
    for (auto& [name, t] : m->named_parameters(false)) holders[t.impl()].push_back(path);

  std::map<std::string, UnitLayout> by_path;
  const auto named = model.named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const auto& [name, t] = named[k];
    if (!t.requires_grad()) continue;
    EMBER_CHECK(t.dtype() == DType::f32, "sharded data parallel: parameter '", name, "' is ", dtype_name(t.dtype()),
                "; sharded units keep f32 master weights, so parameters must be f32 (use mixed_precision for "
                "lower-precision compute)");
    std::string unit;  // the deepest wrapped path holding every holder of t
    for (const std::string& w : wrapped) {
      const auto& hs = holders[t.impl()];
      const bool all = std::all_of(hs.begin(), hs.end(), [&](const std::string& h) { return is_ancestor_or_self(w, h); });
      if (all && w.size() > unit.size()) unit = w;
    }
    UnitLayout& u = by_path[unit];
    u.name = unit;
    u.params.push_back(FlatParamEntry{name, t, u.numel, t.numel(), int64_t(k)});
    u.numel += t.numel();
  }

  std::vector<UnitLayout> units;
  for (auto& [path, u] : by_path) {
    const int64_t n = world_size;
    u.padded_numel = std::max<int64_t>(n, (u.numel + n - 1) / n * n);
    u.shard_numel = u.padded_numel / n;
    units.push_back(std::move(u));
  }
  std::sort(units.begin(), units.end(), [](const UnitLayout& a, const UnitLayout& b) {
    return a.params.front().model_index < b.params.front().model_index;
  });
  return units;
}

}  // namespace ember::distributed
