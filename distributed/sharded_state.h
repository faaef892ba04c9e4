// Tensors split across processes, on disk: each process writes its pieces of the global tensors
// to its own safetensors file, with the pieces' places in the file's metadata, and any split of
// the same tensors (another world size, another strategy, or whole tensors) is read back from
// the overlapping byte ranges of those files. See docs/sharded_data_parallel.md, section 6.
//
//   shard file metadata: "format": "ember-sharded"
//                        "ember.pieces": {"<key>": {"shape": [768, 768], "first": 196608}, ...}
//                        "scalar.<name>": "<number>" (as in every checkpoint file)
//   shard file tensors:  "<key>": 1-D, the elements [first, first + numel) of the tensor flattened
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/io/safetensors.h"

namespace ember::distributed {

// A process's part of one global tensor: elements [first, first + values.numel()) of the tensor
// flattened in row-major order.
struct TensorPiece {
  Shape shape;  // the whole tensor's
  int64_t first = 0;
  Tensor values;  // 1-D
};
using PieceMap = std::map<std::string, TensorPiece>;

// Where a process's tensor lies in a global one: elements [first, first + numel) of the global
// tensor of shape `shape`, held in shape `local` (a 1-D shard, or the whole shape). `piece`:
// the tensor is a shard view (every process holds a part), not a whole replicated tensor.
struct StateSlot {
  Shape shape;
  int64_t first = 0;
  int64_t numel = 0;
  Shape local;
  bool piece = false;
};

// Numbers stored in a safetensors file's metadata as "scalar.<name>": "<number>" (every
// checkpoint file keeps its non-tensor state so). Reading raises naming `path` on a malformed one.
void put_scalars(std::map<std::string, std::string>& metadata, const std::map<std::string, double>& scalars);
std::map<std::string, double> scalars_from_metadata(const std::map<std::string, std::string>& metadata,
                                                    const std::string& path);

// The piece that is all of `t`.
TensorPiece whole_piece(const Tensor& t);

// Writes `pieces` and `scalars` as one shard file, atomically (nn::save_safetensors).
void save_shard_file(const std::string& path, const PieceMap& pieces, const std::map<std::string, double>& scalars);

// The pieces of one object's global tensors: the shard files it was saved in, or one ordinary
// safetensors file (or a map of tensors) of whole tensors. Opening reads and checks headers
// only: every file's layout, the pieces' places, and that the pieces of each tensor cover it
// exactly once; a truncated, missing or inconsistent file is an ember::Error naming it.
class PieceReader {
 public:
  static PieceReader open_shards(const std::vector<std::string>& files);
  // Scalars come from the file's "scalar.<name>" metadata.
  static PieceReader open_whole(const std::string& file);
  static PieceReader from_tensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, double>& scalars, const std::string& source);

  std::vector<std::string> keys() const;
  bool contains(const std::string& key) const { return tensors_.count(key) != 0; }
  const Shape& shape(const std::string& key) const;
  DType dtype(const std::string& key) const;
  const std::map<std::string, double>& scalars() const { return scalars_; }
  // What the pieces were read from, for messages.
  const std::string& source() const { return source_; }

  // Elements [first, first + numel) of `key` flattened, in its saved dtype; reads only the
  // bytes of the pieces that overlap them.
  Tensor read(const std::string& key, int64_t first, int64_t numel) const;
  // All of `key`, in its shape.
  Tensor read_whole(const std::string& key) const;

 private:
  struct Part {
    int64_t first = 0;
    int64_t numel = 0;
    int file = -1;  // index into files_; -1: held in `values`
    Tensor values;
  };
  struct Global {
    Shape shape;
    DType dtype = DType::f32;
    std::vector<Part> parts;  // sorted by first, tiling the tensor
  };
  void add_part(const std::string& key, const Shape& shape, DType dtype, Part part, const std::string& where);
  void check_coverage() const;

  std::vector<std::string> files_;
  std::vector<nn::SafetensorsHeader> headers_;  // parallel to files_, read once when opened
  std::map<std::string, Global> tensors_;
  std::map<std::string, double> scalars_;
  std::string source_;
};

}  // namespace ember::distributed
