#include "engine/serialization/checkpoint_writer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::serialization {

namespace {

std::map<std::string, std::string> FormatMetadata() { return {{"format", "pt"}}; }

// The piece of `key` as a CheckpointPiece, checked to be a dim-0 slice.
void CheckDim0Slice(const std::string& key, const Tensor& t, const nn::ShardedEntry& e) {
  const Shape& local = t.sizes();
  bool ok = local.size() == e.global_shape.size() && e.offsets.size() == e.global_shape.size();
  for (size_t d = 0; ok && d < local.size(); ++d) {
    if (d > 0) ok = e.offsets[d] == 0 && local[d] == e.global_shape[d];
    else ok = e.offsets[0] >= 0 && e.offsets[0] + local[0] <= e.global_shape[0];
  }
  FSDP_CHECK(ok, "checkpoint: sharded entry '", key, "' of shape ", ShapeStr(local),
             " at offsets ", ShapeStr(e.offsets), " is not a dim-0 slice of global shape ",
             ShapeStr(e.global_shape));
}

}  // namespace

WrittenShard WriteShardFile(const std::string& dir, const std::string& prefix, int rank,
                            int world_size, const nn::StateDict& state_dict) {
  FSDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "checkpoint: rank ", rank,
             " is not in a world of ", world_size);
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::ordered_json sharding = nlohmann::ordered_json::object();
  for (const auto& [key, tensor] : state_dict) {
    const nn::ShardedEntry* entry = state_dict.sharding(key);
    if (entry == nullptr) {
      if (rank == 0) tensors.emplace_back(key, tensor);
      continue;
    }
    CheckDim0Slice(key, tensor, *entry);
    sharding[key] = {{"global_shape", entry->global_shape}, {"offsets", entry->offsets}};
    tensors.emplace_back(key, tensor);
  }
  std::map<std::string, std::string> metadata = FormatMetadata();
  metadata[kShardingMetadataKey] = sharding.dump();
  metadata["fsdp.rank"] = std::to_string(rank);
  metadata["fsdp.world_size"] = std::to_string(world_size);
  const std::string bytes = EncodeSafetensors(tensors, metadata);
  WrittenShard out;
  out.hash = ContentHash(bytes);
  out.file = ShardFileName(prefix, rank, world_size, out.hash);
  WriteFileAtomically((std::filesystem::path(dir) / out.file).string(), bytes);
  return out;
}

CheckpointIndex CommitShardedCheckpoint(const std::string& dir, const std::string& prefix,
                                        int world_size, const std::vector<std::string>& files) {
  FSDP_CHECK(static_cast<int>(files.size()) == world_size, "checkpoint: ", files.size(),
             " shard files for a world of ", world_size);
  const std::filesystem::path root(dir);
  CheckpointIndex index;
  index.world_size = world_size;
  for (const std::string& file : files) {
    const std::string path = (root / file).string();
    const SafetensorsFile f = LoadSafetensors(path);
    nlohmann::json sharding = nlohmann::json::object();
    if (auto it = f.metadata.find(kShardingMetadataKey); it != f.metadata.end()) {
      try {
        sharding = nlohmann::json::parse(it->second);
      } catch (const nlohmann::json::exception& e) {
        FSDP_THROW(ErrorCode::kDataLoss, path, ": metadata ", kShardingMetadataKey,
                   " is not valid JSON: ", e.what());
      }
    }
    for (const SafetensorsEntry& e : f.entries) {
      CheckpointPiece piece{file, Shape(e.shape.size(), 0), e.shape};
      Shape global = e.shape;
      if (sharding.contains(e.name)) {
        try {
          piece.offsets = sharding[e.name].at("offsets").get<Shape>();
          global = sharding[e.name].at("global_shape").get<Shape>();
        } catch (const nlohmann::json::exception& ex) {
          FSDP_THROW(ErrorCode::kDataLoss, path, ": tensor '", e.name, "': metadata ",
                     kShardingMetadataKey, " needs offsets and global_shape: ", ex.what());
        }
      }
      auto [it, fresh] = index.tensors.try_emplace(e.name, CheckpointTensor{e.dtype, global, {}});
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, it->second.dtype == e.dtype &&
                                                it->second.global_shape == global,
                      path, ": tensor '", e.name, "' is ", e.dtype, " of global shape ",
                      ShapeStr(global), " but another rank's file has ", it->second.dtype, " of ",
                      ShapeStr(it->second.global_shape));
      it->second.pieces.push_back(std::move(piece));
    }
  }
  const std::string index_path = (root / IndexFileName(prefix)).string();
  index.Validate(index_path);
  WriteFileAtomically(index_path, index.ToJson());
  // The new checkpoint is committed: remove what it does not name.
  const std::vector<std::string> named = index.files();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool stale_shard = IsShardFileName(prefix, name) &&
                             std::find(named.begin(), named.end(), name) == named.end();
    const bool stale_tmp = name.rfind("." + prefix + "-", 0) == 0 ||
                           name.rfind("." + IndexFileName(prefix) + ".tmp.", 0) == 0;
    if (stale_shard || (stale_tmp && name.find(".tmp.") != std::string::npos)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return index;
}

void SaveFullCheckpoint(const std::string& path, const nn::StateDict& state_dict) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [key, tensor] : state_dict) {
    FSDP_CHECK(state_dict.sharding(key) == nullptr, "checkpoint: '", key,
               "' is a sharded entry; a full checkpoint needs full tensors (save it as a sharded "
               "checkpoint, or gather it with full_state_dict)");
    tensors.emplace_back(key, tensor);
  }
  SaveSafetensors(path, tensors, FormatMetadata());
}

}  // namespace fsdp::serialization
