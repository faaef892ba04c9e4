#include "distributed/sharded_state.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/grad_mode.h"
#include "core/error.h"
#include "nn/io/safetensors.h"

namespace ember::distributed {

namespace {

constexpr const char* kScalarPrefix = "scalar.";
constexpr const char* kPiecesKey = "ember.pieces";

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

int64_t json_index(const nlohmann::json& v, const std::string& where) {
  EMBER_CHECK(v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(INT64_MAX), where, " is ", v.dump(),
              ", expected a non-negative integer");
  return v.get<int64_t>();
}

}  // namespace

void put_scalars(std::map<std::string, std::string>& metadata, const std::map<std::string, double>& scalars) {
  for (const auto& [k, v] : scalars) metadata[kScalarPrefix + k] = format_double(v);
}

std::map<std::string, double> scalars_from_metadata(const std::map<std::string, std::string>& metadata,
                                                    const std::string& path) {
  std::map<std::string, double> out;
  const std::string prefix = kScalarPrefix;
  for (const auto& [k, v] : metadata) {
    if (k.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    EMBER_CHECK(end && *end == '\0' && !v.empty(), "load_state: ", path, " holds a malformed number '", v, "' for '",
                k.substr(prefix.size()), "'");
    out[k.substr(prefix.size())] = x;
  }
  return out;
}

TensorPiece whole_piece(const Tensor& t) { return TensorPiece{t.shape(), 0, t.contiguous().reshape({t.numel()})}; }

void save_shard_file(const std::string& path, const PieceMap& pieces, const std::map<std::string, double>& scalars) {
  nlohmann::json places = nlohmann::json::object();
  std::map<std::string, Tensor> tensors;
  for (const auto& [key, p] : pieces) {
    EMBER_CHECK(p.values.dim() == 1, "save_state: piece '", key, "' must be 1-D, got shape ", p.values.shape());
    places[key] = {{"shape", p.shape}, {"first", p.first}};
    tensors[key] = p.values;
  }
  std::map<std::string, std::string> metadata{{"format", "ember-sharded"}, {kPiecesKey, places.dump()}};
  put_scalars(metadata, scalars);
  nn::save_safetensors(path, tensors, metadata);
}

void PieceReader::add_part(const std::string& key, const Shape& shape, DType dtype, Part part,
                           const std::string& where) {
  auto [it, fresh] = tensors_.try_emplace(key, Global{shape, dtype, {}});
  Global& g = it->second;
  EMBER_CHECK(fresh || g.shape == shape, "load_state: ", where, ": '", key, "' is a tensor of shape ", shape,
              " here but of shape ", g.shape, " in ", source_);
  EMBER_CHECK(fresh || g.dtype == dtype, "load_state: ", where, ": '", key, "' has dtype ", dtype, " here but ",
              g.dtype, " in ", source_);
  EMBER_CHECK(part.first >= 0 && part.first + part.numel <= numel_of(shape), "load_state: ", where, ": the piece of '",
              key, "' at elements [", part.first, ", ", part.first + part.numel, ") lies outside its shape ", shape);
  if (part.numel > 0) g.parts.push_back(std::move(part));
}

void PieceReader::check_coverage() const {
  for (const auto& [key, g] : tensors_) {
    std::vector<Part> parts = g.parts;
    std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.first < b.first; });
    int64_t next = 0;
    for (const Part& p : parts) {
      EMBER_CHECK(p.first >= next, "load_state: ", source_, ": elements [", p.first, ", ", std::min(next, p.first + p.numel),
                  ") of '", key, "' are in two pieces");
      EMBER_CHECK(p.first == next, "load_state: ", source_, ": elements [", next, ", ", p.first, ") of '", key,
                  "' are in no file");
      next += p.numel;
    }
    EMBER_CHECK(next == numel_of(g.shape), "load_state: ", source_, ": elements [", next, ", ", numel_of(g.shape),
                ") of '", key, "' (shape ", g.shape, ") are in no file; is a shard file missing?");
  }
}

PieceReader PieceReader::open_shards(const std::vector<std::string>& files) {
  PieceReader r;
  r.files_ = files;
  r.headers_.reserve(files.size());  // the loop keeps a reference to the newest
  r.source_ = files.empty() ? std::string("no files") : files.front() + (files.size() > 1 ? " ..." : "");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& f = files[i];
    EMBER_CHECK(std::filesystem::exists(f), "load_state: ", f, " is missing");
    const nn::SafetensorsHeader& h = r.headers_.emplace_back(nn::read_safetensors_header(f));
    const auto meta = h.metadata.find(kPiecesKey);
    EMBER_CHECK(meta != h.metadata.end(), "load_state: ", f, " has no '", kPiecesKey,
                "' metadata, so it is not a shard file of a sharded checkpoint");
    nlohmann::json places;
    try {
      places = nlohmann::json::parse(meta->second);
    } catch (const nlohmann::json::exception& e) {
      EMBER_FAIL("load_state: ", f, ": '", kPiecesKey, "' is not valid JSON: ", e.what());
    }
    EMBER_CHECK(places.is_object(), "load_state: ", f, ": '", kPiecesKey, "' is not a JSON object");
    for (const auto& [key, entry] : h.tensors) {
      const std::string where = f + ": " + kPiecesKey + "." + key;
      EMBER_CHECK(places.contains(key), "load_state: ", f, ": tensor '", key, "' has no place in '", kPiecesKey, "'");
      const nlohmann::json& place = places.at(key);
      EMBER_CHECK(place.is_object() && place.contains("shape") && place.at("shape").is_array() &&
                      place.contains("first"),
                  "load_state: ", where, " is ", place.dump(), ", expected {\"shape\": [...], \"first\": n}");
      Shape shape;
      for (const auto& d : place.at("shape")) shape.push_back(json_index(d, "load_state: " + where + ".shape"));
      EMBER_CHECK(entry.shape.size() == 1, "load_state: ", f, ": piece '", key, "' has shape ", entry.shape,
                  ", expected 1-D");
      r.add_part(key, shape, entry.dtype, Part{json_index(place.at("first"), "load_state: " + where + ".first"),
                                               entry.shape[0], int(i), Tensor()},
                 f);
    }
    for (auto& [k, v] : scalars_from_metadata(h.metadata, f)) r.scalars_.emplace(k, v);
  }
  r.check_coverage();
  return r;
}

PieceReader PieceReader::open_whole(const std::string& file) {
  EMBER_CHECK(std::filesystem::exists(file), "load_state: ", file, " is missing");
  PieceReader r;
  const nn::SafetensorsHeader& h = r.headers_.emplace_back(nn::read_safetensors_header(file));
  r.files_ = {file};
  r.source_ = file;
  for (const auto& [key, entry] : h.tensors)
    r.add_part(key, entry.shape, entry.dtype, Part{0, numel_of(entry.shape), 0, Tensor()}, file);
  r.scalars_ = scalars_from_metadata(h.metadata, file);
  return r;
}

PieceReader PieceReader::from_tensors(const std::map<std::string, Tensor>& tensors,
                                      const std::map<std::string, double>& scalars, const std::string& source) {
  PieceReader r;
  r.source_ = source;
  for (const auto& [key, t] : tensors) {
    TensorPiece p = whole_piece(t);
    r.add_part(key, p.shape, t.dtype(), Part{0, t.numel(), -1, p.values}, source);
  }
  r.scalars_ = scalars;
  return r;
}

std::vector<std::string> PieceReader::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, g] : tensors_) out.push_back(k);
  return out;
}

const Shape& PieceReader::shape(const std::string& key) const {
  const auto it = tensors_.find(key);
  EMBER_CHECK(it != tensors_.end(), "load_state: ", source_, " holds no tensor '", key, "'");
  return it->second.shape;
}

DType PieceReader::dtype(const std::string& key) const {
  shape(key);
  return tensors_.at(key).dtype;
}

Tensor PieceReader::read(const std::string& key, int64_t first, int64_t numel) const {
  shape(key);  // raises naming the key when there is no such tensor
  const Global& g = tensors_.at(key);
  EMBER_CHECK(first >= 0 && numel >= 0 && first + numel <= numel_of(g.shape), "load_state: ", source_, ": '", key,
              "' has ", numel_of(g.shape), " elements; elements [", first, ", ", first + numel, ") were asked for");
  NoGradGuard no_grad;
  Tensor out = make_tensor({numel}, g.dtype, Device::cpu());
  for (const Part& p : g.parts) {
    const int64_t lo = std::max(first, p.first), hi = std::min(first + numel, p.first + p.numel);
    if (lo >= hi) continue;
    Tensor src = p.file >= 0 ? nn::load_safetensors_range(files_[size_t(p.file)], headers_[size_t(p.file)], key,
                                                          lo - p.first, hi - lo)
                             : p.values.narrow(0, lo - p.first, hi - lo);
    out.narrow(0, lo - first, hi - lo).copy_(src);
  }
  return out;
}

Tensor PieceReader::read_whole(const std::string& key) const {
  const Shape& s = shape(key);
  return read(key, 0, numel_of(s)).reshape(s);
}

}  // namespace ember::distributed
