// Nested structures of tensors, which the collectives take as Accelerate's operations take
// nested lists, tuples and dicts: a Tensor, or a std::vector, std::tuple, std::pair, Batch or
// std::map<std::string, ...> whose elements are such structures.
//
//   auto [predictions, labels] = acc.gather_for_metrics(std::make_tuple(logits.argmax(-1), batch["labels"]));
//
// flatten lists the tensors of a structure (its leaves) in a fixed order, with a name for each
// that error messages use ("[1]", "['labels']", "[0]['mask']"); rebuild makes the same
// structure, holding new tensors in that order. Tuples of references (std::tie) come back as
// tuples of values.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/batch.h"
#include "core/tensor.h"

namespace ember::distributed {

// A structure's leaves, in order, and their names.
struct TensorLeaves {
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
};

// Specialised below for every structure; `type` is what rebuild returns.
template <typename T>
struct TensorTree {};

template <typename T>
concept TensorStructure = requires { typename TensorTree<std::remove_cvref_t<T>>::type; };

// A structure other than a lone Tensor (those keep their own overloads).
template <typename T>
concept NestedTensors = TensorStructure<T> && !std::is_same_v<std::remove_cvref_t<T>, Tensor>;

template <typename T>
using tensor_tree_t = typename TensorTree<std::remove_cvref_t<T>>::type;

template <>
struct TensorTree<Tensor> {
  using type = Tensor;
  static void flatten(const Tensor& t, const std::string& name, TensorLeaves& out) {
    out.tensors.push_back(t);
    out.names.push_back(name.empty() ? "the tensor" : name);
  }
  static Tensor rebuild(const Tensor&, const std::vector<Tensor>& leaves, size_t& next) { return leaves[next++]; }
};

template <TensorStructure T>
struct TensorTree<std::vector<T>> {
  using type = std::vector<tensor_tree_t<T>>;
  static void flatten(const std::vector<T>& v, const std::string& name, TensorLeaves& out) {
    for (size_t i = 0; i < v.size(); ++i)
      TensorTree<std::remove_cvref_t<T>>::flatten(v[i], name + "[" + std::to_string(i) + "]", out);
  }
  static type rebuild(const std::vector<T>& v, const std::vector<Tensor>& leaves, size_t& next) {
    type out;
    out.reserve(v.size());
    for (const auto& e : v) out.push_back(TensorTree<std::remove_cvref_t<T>>::rebuild(e, leaves, next));
    return out;
  }
};

template <TensorStructure T>
struct TensorTree<std::map<std::string, T>> {
  using type = std::map<std::string, tensor_tree_t<T>>;
  static void flatten(const std::map<std::string, T>& m, const std::string& name, TensorLeaves& out) {
    for (const auto& [key, value] : m) TensorTree<std::remove_cvref_t<T>>::flatten(value, name + "['" + key + "']", out);
  }
  static type rebuild(const std::map<std::string, T>& m, const std::vector<Tensor>& leaves, size_t& next) {
    type out;
    for (const auto& [key, value] : m) out.emplace(key, TensorTree<std::remove_cvref_t<T>>::rebuild(value, leaves, next));
    return out;
  }
};

template <>
struct TensorTree<Batch> {
  using type = Batch;
  static void flatten(const Batch& b, const std::string& name, TensorLeaves& out) {
    TensorTree<std::map<std::string, Tensor>>::flatten(b.fields, name, out);
  }
  static Batch rebuild(const Batch& b, const std::vector<Tensor>& leaves, size_t& next) {
    return Batch{TensorTree<std::map<std::string, Tensor>>::rebuild(b.fields, leaves, next)};
  }
};

template <TensorStructure... T>
struct TensorTree<std::tuple<T...>> {
  using type = std::tuple<tensor_tree_t<T>...>;
  static void flatten(const std::tuple<T...>& t, const std::string& name, TensorLeaves& out) {
    flatten_each(t, name, out, std::index_sequence_for<T...>{});
  }
  static type rebuild(const std::tuple<T...>& t, const std::vector<Tensor>& leaves, size_t& next) {
    return rebuild_each(t, leaves, next, std::index_sequence_for<T...>{});
  }

 private:
  template <size_t... I>
  static void flatten_each(const std::tuple<T...>& t, const std::string& name, TensorLeaves& out,
                           std::index_sequence<I...>) {
    (TensorTree<std::remove_cvref_t<T>>::flatten(std::get<I>(t), name + "[" + std::to_string(I) + "]", out), ...);
  }
  template <size_t... I>
  static type rebuild_each(const std::tuple<T...>& t, const std::vector<Tensor>& leaves, size_t& next,
                           std::index_sequence<I...>) {
    // Braced initialisation runs the element rebuilds left to right, in leaf order.
    return type{TensorTree<std::remove_cvref_t<T>>::rebuild(std::get<I>(t), leaves, next)...};
  }
};

template <TensorStructure A, TensorStructure B>
struct TensorTree<std::pair<A, B>> {
  using type = std::pair<tensor_tree_t<A>, tensor_tree_t<B>>;
  static void flatten(const std::pair<A, B>& p, const std::string& name, TensorLeaves& out) {
    TensorTree<std::remove_cvref_t<A>>::flatten(p.first, name + "[0]", out);
    TensorTree<std::remove_cvref_t<B>>::flatten(p.second, name + "[1]", out);
  }
  static type rebuild(const std::pair<A, B>& p, const std::vector<Tensor>& leaves, size_t& next) {
    auto first = TensorTree<std::remove_cvref_t<A>>::rebuild(p.first, leaves, next);
    auto second = TensorTree<std::remove_cvref_t<B>>::rebuild(p.second, leaves, next);
    return type{std::move(first), std::move(second)};
  }
};

template <TensorStructure S>
TensorLeaves flatten_tensors(const S& s) {
  TensorLeaves out;
  TensorTree<std::remove_cvref_t<S>>::flatten(s, "", out);
  return out;
}

// `like`'s structure holding `leaves` (as many as flatten_tensors(like) gave, in its order).
template <TensorStructure S>
tensor_tree_t<S> rebuild_tensors(const S& like, const std::vector<Tensor>& leaves) {
  size_t next = 0;
  return TensorTree<std::remove_cvref_t<S>>::rebuild(like, leaves, next);
}

}  // namespace ember::distributed
