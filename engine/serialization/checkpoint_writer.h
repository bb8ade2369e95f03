// Writing checkpoints (docs/checkpoint.md): a full state dict as one `.safetensors` file, a
// sharded one as one file per rank plus the index (CheckpointIndex) written last.
//
// Commit protocol of a sharded checkpoint (what makes a whole multi-file save atomic under
// kill -9): every rank writes its file with WriteShardFile, atomically and under a name that
// carries the hash of its bytes, so a new save never overwrites a file the current index names
// with other bytes. When every rank is done (the caller's barrier), one process calls
// CommitShardedCheckpoint: it reads the new files, checks that their pieces tile every tensor,
// writes the index atomically (the commit point: before the rename the directory is the old
// checkpoint, after it the new one) and only then removes the shard files no longer named and
// the temporary files of crashed writes. A crash at any moment leaves a loadable checkpoint:
// the old one or the new one.
//
// Thread-safety: stateless functions. One save per directory and prefix at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/serialization/checkpoint_index.h"

namespace fsdp::serialization {

// The file one rank wrote: its name in the directory and the hash in that name.
struct WrittenShard {
  std::string file;
  uint64_t hash = 0;
};

// Writes rank `rank`'s file of a sharded checkpoint of `world_size` ranks into `dir`: the piece
// of every sharded entry (state_dict.sharding(key) gives its global shape and offsets), and the
// full entries only on rank 0 (replicated values are stored once). InvalidArgument naming the
// key for a sharded entry that is not a dim-0 slice; Unavailable when the file cannot be
// written.
WrittenShard WriteShardFile(const std::string& dir, const std::string& prefix, int rank,
                            int world_size, const nn::StateDict& state_dict);

// The commit (see above): `files` are the names WriteShardFile returned on every rank. Returns
// the index written. DataLoss naming the file and key when the files are inconsistent (pieces
// that do not tile a tensor, dtypes or global shapes that disagree); the previous checkpoint
// is then untouched.
CheckpointIndex CommitShardedCheckpoint(const std::string& dir, const std::string& prefix,
                                        int world_size, const std::vector<std::string>& files);

// Writes a full state dict (no sharded entries) as one `.safetensors` file at `path`,
// atomically. InvalidArgument naming a sharded key.
void SaveFullCheckpoint(const std::string& path, const nn::StateDict& state_dict);

}  // namespace fsdp::serialization
