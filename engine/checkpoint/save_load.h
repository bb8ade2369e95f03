// Collective checkpoint saving and loading (torch.distributed.checkpoint.save / load in the
// file formats of docs/checkpoint.md): every rank of a process group writes its file of a
// sharded checkpoint, rank 0 commits the index; loading reads any world size's checkpoint into
// this world's layout.
//
//   checkpoint::save(checkpoint::get_model_state_dict(*model), dir, pg);
//   checkpoint::save(checkpoint::get_optimizer_state_dict(*model, optim), dir, pg, "optimizer");
//   ...  // later, at any world size
//   auto sd = checkpoint::load(checkpoint::get_model_state_dict(*model), dir, pg);
//   checkpoint::set_model_state_dict(*model, sd);
//
// save(): each rank writes its file (serialization::WriteShardFile: its pieces, and the
// replicated values on rank 0), the ranks all-gather the hashes that name the files, rank 0
// commits (serialization::CommitShardedCheckpoint: the index is the commit point, then stale
// files go) and tells the others the outcome: every rank returns, or every rank throws.
// load(): each rank reads the rows its dict needs; the ranks agree (an all-reduce) that every
// rank read its part before any returns, so a fault on one rank (truncated or corrupt file,
// missing shard, key or shape mismatch, each naming the file and key) is an error on all and
// nothing is loaded anywhere.
//
// Thread-safety: collective; every rank of `pg` calls it, in the same order.
#pragma once

#include <string>

#include "engine/distributed/process_group.h"
#include "engine/nn/module.h"

namespace fsdp::checkpoint {

// Saves `state_dict` (this rank's dict: sharded and full entries) as a sharded checkpoint of
// pg.size() ranks under `prefix` in `dir` (created when missing).
void save(const nn::StateDict& state_dict, const std::string& dir, distributed::ProcessGroup& pg,
          const std::string& prefix = "model");

// The values of the checkpoint under `prefix` in `dir` (a sharded checkpoint of any world size,
// or the single file `<prefix>.safetensors`) in the layout of `like` (this rank's dict; only
// keys, dtypes, shapes and shardings are used). With `strict`, keys must match exactly.
nn::StateDict load(const nn::StateDict& like, const std::string& dir,
                   distributed::ProcessGroup& pg, const std::string& prefix = "model",
                   bool strict = true);

}  // namespace fsdp::checkpoint
