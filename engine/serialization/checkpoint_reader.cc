#include "engine/serialization/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"

namespace fsdp::serialization {

namespace {

// Index files are small; 1 GiB keeps a corrupt one from exhausting memory.
constexpr size_t kMaxIndexBytes = size_t{1} << 30;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Join(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

CheckpointReader CheckpointReader::Open(const std::string& path, const std::string& prefix) {
  namespace fs = std::filesystem;
  CheckpointReader reader;
  std::string file = path;
  if (fs::is_directory(path)) {
    const fs::path index = fs::path(path) / IndexFileName(prefix);
    const fs::path full = fs::path(path) / FullFileName(prefix);
    FSDP_CHECK_CODE(ErrorCode::kNotFound, fs::exists(index) || fs::exists(full),
                    "no checkpoint in ", path, ": neither ", index.string(), " nor ",
                    full.string(), " exists");
    file = (fs::exists(index) ? index : full).string();
  }
  const fs::path p(file);
  reader.dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
  reader.source_ = file;
  if (EndsWith(file, ".json")) {
    reader.index_ = CheckpointIndex::FromJson(ReadRegularFile(file, kMaxIndexBytes), file);
    return reader;
  }
  // A single file: each entry is a whole tensor, one piece.
  const std::string name = p.filename().string();
  SafetensorsFile parsed = LoadSafetensors(file);
  for (const SafetensorsEntry& e : parsed.entries) {
    reader.index_.tensors[e.name] =
        CheckpointTensor{e.dtype, e.shape, {CheckpointPiece{name, Shape(e.shape.size(), 0), e.shape}}};
  }
  reader.files_.emplace(name, std::move(parsed));
  return reader;
}

const SafetensorsFile& CheckpointReader::File(const std::string& name) {
  if (auto it = files_.find(name); it != files_.end()) return it->second;
  const std::string path = (std::filesystem::path(dir_) / name).string();
  SafetensorsFile file;
  try {
    file = LoadSafetensors(path);
  } catch (const Error& e) {
    FSDP_THROW(e.code(), "cannot load checkpoint ", source_, ": ", e.message(),
               " (the file holds ", Join(index_.keys_in(name)), ")");
  }
  // Every piece the index places in this file must be there, as the index describes it.
  for (const std::string& key : index_.keys_in(name)) {
    const CheckpointTensor& t = index_.tensors.at(key);
    const SafetensorsEntry* entry = file.Find(key);
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, entry != nullptr, path, ": tensor '", key,
                    "' is missing (the index ", source_, " places a piece of it here)");
    Shape indexed;
    for (const CheckpointPiece& p : t.pieces) {
      if (p.file == name) indexed = p.shape;
    }
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, entry->dtype == t.dtype && entry->shape == indexed, path,
                    ": tensor '", key, "' is ", entry->dtype, " of shape ", ShapeStr(entry->shape),
                    " but the index ", source_, " says ", t.dtype, " of shape ", ShapeStr(indexed));
  }
  return files_.emplace(name, std::move(file)).first->second;
}

nn::StateDict CheckpointReader::Read(const nn::StateDict& like, bool strict) {
  // 1. Keys, dtypes and shapes, before reading any file.
  std::vector<std::string> missing;
  for (const auto& [key, tensor] : like) {
    auto it = index_.tensors.find(key);
    if (it == index_.tensors.end()) {
      missing.push_back(key);
      continue;
    }
    const CheckpointTensor& t = it->second;
    const nn::ShardedEntry* sharding = like.sharding(key);
    const Shape& global = sharding != nullptr ? sharding->global_shape : tensor.sizes();
    FSDP_CHECK(t.dtype == SafetensorsDTypeName(tensor.dtype()), "checkpoint ", source_,
               ": tensor '", key, "' is ", t.dtype, " but the state dict expects ",
               SafetensorsDTypeName(tensor.dtype()));
    FSDP_CHECK(t.global_shape == global, "checkpoint ", source_, ": size mismatch for ", key,
               ": copying a param with shape ", ShapeStr(t.global_shape),
               " from checkpoint, the shape in current model is ", ShapeStr(global), ".");
    if (sharding != nullptr) {
      bool ok = sharding->offsets.size() == global.size() && tensor.dim() == static_cast<int64_t>(global.size());
      for (size_t d = 0; ok && d < global.size(); ++d) {
        ok = d == 0 ? sharding->offsets[0] >= 0 && sharding->offsets[0] + tensor.size(0) <= global[0]
                    : sharding->offsets[d] == 0 && tensor.size(static_cast<int64_t>(d)) == global[d];
      }
      FSDP_CHECK(ok, "checkpoint: the state dict's '", key, "' of shape ", ShapeStr(tensor.sizes()),
                 " at offsets ", ShapeStr(sharding->offsets), " is not a dim-0 slice of ",
                 ShapeStr(global));
    }
  }
  FSDP_CHECK_CODE(ErrorCode::kNotFound, !strict || missing.empty(), "checkpoint ", source_,
                  ": Missing key(s) in state_dict: ", Join(missing), ".");
  if (strict) {
    std::vector<std::string> unexpected;
    for (const auto& [key, t] : index_.tensors) {
      if (like.find(key) == nullptr) unexpected.push_back(key);
    }
    FSDP_CHECK_CODE(ErrorCode::kNotFound, unexpected.empty(), "checkpoint ", source_,
                    ": Unexpected key(s) in state_dict: ", Join(unexpected), ".");
  }
  // 2. Every needed file, parsed and checked against the index.
  for (const auto& [key, tensor] : like) {
    auto it = index_.tensors.find(key);
    if (it == index_.tensors.end()) continue;
    for (const CheckpointPiece& p : it->second.pieces) File(p.file);
  }
  // 3. The requested rows, assembled from the pieces that overlap them.
  nn::StateDict out;
  for (const auto& [key, tensor] : like) {
    auto it = index_.tensors.find(key);
    if (it == index_.tensors.end()) continue;
    const CheckpointTensor& t = it->second;
    const nn::ShardedEntry* sharding = like.sharding(key);
    Tensor result = Tensor::empty(tensor.sizes(), tensor.dtype());
    if (t.global_shape.empty()) {
      const SafetensorsEntry* e = File(t.pieces[0].file).Find(key);
      std::memcpy(result.data_ptr(), e->bytes.data(), e->bytes.size());
    } else {
      const int64_t begin = sharding != nullptr ? sharding->offsets[0] : 0;
      const int64_t end = begin + tensor.size(0);
      const size_t row_bytes =
          tensor.size(0) > 0 ? result.nbytes() / static_cast<size_t>(tensor.size(0)) : 0;
      auto* dst = static_cast<uint8_t*>(result.data_ptr());
      for (const CheckpointPiece& p : t.pieces) {
        const int64_t lo = std::max(begin, p.offsets[0]);
        const int64_t hi = std::min(end, p.offsets[0] + p.shape[0]);
        if (lo >= hi) continue;
        const SafetensorsEntry* e = File(p.file).Find(key);
        std::memcpy(dst + static_cast<size_t>(lo - begin) * row_bytes,
                    e->bytes.data() + static_cast<size_t>(lo - p.offsets[0]) * row_bytes,
                    static_cast<size_t>(hi - lo) * row_bytes);
      }
    }
    out.insert(key, result);
    if (sharding != nullptr) out.sharded.insert(key, *sharding);
  }
  return out;
}

}  // namespace fsdp::serialization
