// CheckpointIndex: the layout of a checkpoint, one `.safetensors` file or a sharded checkpoint
// (one file per rank plus an index JSON in Hugging Face's sharded-checkpoint convention), and
// the file names of both (docs/checkpoint.md).
//
// A sharded checkpoint of prefix P (P = "model" for a model, "optimizer" for optimizer state)
// in a directory holds:
//   P.safetensors.index.json            the index, the checkpoint's commit point:
//     {"metadata": {"total_size": <bytes of all global tensors>, "format": "fsdp-sharded",
//                   "world_size": "<N>"},
//      "weight_map": {"<fqn>": "<file holding the piece at offset 0>", ...},
//      "shards": {"<fqn>": {"dtype": "F32", "global_shape": [...],
//                           "pieces": [{"file": ..., "offsets": [...], "shape": [...]}]}}}
//   P-0000r-of-0000N-<hash>.safetensors one per rank r (1-based, as Hugging Face numbers
//     them), <hash> the 16 hex digits of the FNV-1a hash of the file's bytes. Each holds the
//     rank's pieces under their FQNs; its `__metadata__` has "fsdp.sharding" (a JSON object
//     FQN → {"global_shape", "offsets"}), "fsdp.rank" and "fsdp.world_size".
// A full checkpoint is the single file P.safetensors, whose entries are the global tensors.
//
// Pieces are dim-0 slices (FSDP's Shard(0) / torch.chunk rows): offsets are zero in every other
// dimension and the trailing dimensions equal the global shape's. Validate() checks that the
// pieces of every tensor tile its rows exactly.
//
// Thread-safety: a value type; stateless functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::serialization {

// One stored piece of a tensor: the file (a name inside the checkpoint's directory) and where
// the piece lies in the global tensor.
struct CheckpointPiece {
  std::string file;
  Shape offsets;
  Shape shape;
};

// One tensor of a checkpoint: its dtype (the safetensors spelling), global shape and pieces.
struct CheckpointTensor {
  std::string dtype;
  Shape global_shape;
  std::vector<CheckpointPiece> pieces;
};

struct CheckpointIndex {
  int world_size = 1;
  std::map<std::string, CheckpointTensor> tensors;  // FQN → tensor

  // The bytes of all global tensors (the index's metadata.total_size).
  uint64_t total_size() const;
  // The index JSON (see above).
  std::string ToJson() const;
  // Parses an index; `source` (its path) names it in errors. DataLoss when malformed.
  static CheckpointIndex FromJson(const std::string& text, const std::string& source);
  // DataLoss naming `source` and the FQN unless every tensor's pieces are dim-0 slices that
  // tile its rows exactly (no gap, no overlap) with the global trailing dimensions.
  void Validate(const std::string& source) const;
  // The files named by the index, sorted, each once.
  std::vector<std::string> files() const;
  // The FQNs with a piece in `file`, in order.
  std::vector<std::string> keys_in(const std::string& file) const;
};

// "<prefix>.safetensors.index.json".
std::string IndexFileName(const std::string& prefix);
// "<prefix>.safetensors".
std::string FullFileName(const std::string& prefix);
// "<prefix>-0000<rank+1>-of-0000<world_size>-<16 hex digits of hash>.safetensors".
std::string ShardFileName(const std::string& prefix, int rank, int world_size, uint64_t hash);
// True when `name` has the form of a ShardFileName of `prefix`.
bool IsShardFileName(const std::string& prefix, const std::string& name);
// The 64-bit FNV-1a hash of `bytes`.
uint64_t ContentHash(const std::string& bytes);

// The "fsdp.sharding" key of a rank file's metadata.
inline constexpr const char* kShardingMetadataKey = "fsdp.sharding";

}  // namespace fsdp::serialization
