// CheckpointReader: reads a checkpoint (one `.safetensors` file or a sharded checkpoint's index
// and rank files, docs/checkpoint.md) into the layout of any state dict: full tensors, or each
// rank's dim-0 piece at any world size (a checkpoint saved at N ranks loads at M).
//
// Reading never loads part of a checkpoint: Read() checks every requested key (present, dtype,
// global shape), reads every file it needs (each is parsed strictly and checked against the
// index) and only then returns the new tensors; the caller's module is untouched on any error.
// Errors name the file and the key: NotFound for a missing file or key, DataLoss for a
// truncated or corrupt file or one that disagrees with the index, InvalidArgument for a dtype
// or shape that differs from the state dict's.
//
// Ownership: holds the parsed index and caches the files it read.
// Thread-safety: not thread-safe (the file cache); use one reader per thread.
#pragma once

#include <map>
#include <string>

#include "engine/nn/module.h"
#include "engine/serialization/checkpoint_index.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::serialization {

class CheckpointReader {
 public:
  // Opens `path`: a `.safetensors` file (a full checkpoint), an index JSON, or a directory
  // holding `<prefix>.safetensors.index.json` (preferred) or `<prefix>.safetensors`.
  static CheckpointReader Open(const std::string& path, const std::string& prefix = "model");

  const CheckpointIndex& index() const { return index_; }
  // The path errors name for the checkpoint as a whole (the index or the single file).
  const std::string& source() const { return source_; }

  // New CPU tensors for the entries of `like`: for an entry with a sharding, the rows
  // [offset, offset + rows) of the global tensor; otherwise the whole tensor. With `strict`,
  // a key of the checkpoint that `like` lacks is an error too (as load_state_dict(strict));
  // without, keys missing from the checkpoint are left out of the result.
  nn::StateDict Read(const nn::StateDict& like, bool strict = true);

 private:
  CheckpointReader() = default;
  // The parsed file `name` of the checkpoint, read once and checked against the index.
  const SafetensorsFile& File(const std::string& name);

  std::string dir_;
  std::string source_;
  CheckpointIndex index_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace fsdp::serialization
