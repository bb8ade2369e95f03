#include "engine/serialization/checkpoint_index.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "engine/core/error.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::serialization {

namespace {

constexpr const char* kIndexFormat = "fsdp-sharded";

[[noreturn]] void Malformed(const std::string& source, const std::string& what) {
  FSDP_THROW(ErrorCode::kDataLoss, source, ": not a valid checkpoint index: ", what);
}

Shape ShapeField(const nlohmann::json& v, const std::string& source, const std::string& what) {
  if (!v.is_array()) Malformed(source, what + " is not an array");
  Shape out;
  for (const auto& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      Malformed(source, what + " has a dimension that is not a non-negative integer: " + v.dump());
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

std::string Padded(int n) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%05d", n);
  return buf;
}

}  // namespace

uint64_t CheckpointIndex::total_size() const {
  uint64_t total = 0;
  for (const auto& [fqn, t] : tensors) {
    total += static_cast<uint64_t>(Numel(t.global_shape)) * SafetensorsElementSize(t.dtype);
  }
  return total;
}

std::string CheckpointIndex::ToJson() const {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  nlohmann::ordered_json shards = nlohmann::ordered_json::object();
  for (const auto& [fqn, t] : tensors) {
    nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
    std::string first = t.pieces.empty() ? "" : t.pieces.front().file;
    for (const CheckpointPiece& p : t.pieces) {
      pieces.push_back({{"file", p.file}, {"offsets", p.offsets}, {"shape", p.shape}});
      if (!p.offsets.empty() && p.offsets[0] == 0) first = p.file;
    }
    weight_map[fqn] = first;
    shards[fqn] = {{"dtype", t.dtype}, {"global_shape", t.global_shape}, {"pieces", pieces}};
  }
  nlohmann::ordered_json out = {
      {"metadata",
       {{"total_size", total_size()}, {"format", kIndexFormat},
        {"world_size", std::to_string(world_size)}}},
      {"weight_map", weight_map},
      {"shards", shards}};
  return out.dump(2) + "\n";
}

CheckpointIndex CheckpointIndex::FromJson(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    Malformed(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("metadata") || !j.contains("weight_map") ||
      !j.contains("shards")) {
    Malformed(source, "needs \"metadata\", \"weight_map\" and \"shards\"");
  }
  const auto& meta = j["metadata"];
  if (!meta.is_object() || meta.value("format", "") != kIndexFormat ||
      !meta.contains("world_size") || !meta["world_size"].is_string()) {
    Malformed(source, std::string("metadata must have format \"") + kIndexFormat +
                          "\" and a world_size string");
  }
  CheckpointIndex index;
  try {
    index.world_size = std::stoi(meta["world_size"].get<std::string>());
  } catch (const std::exception&) {
    Malformed(source, "world_size is not a number: " + meta["world_size"].dump());
  }
  if (!j["shards"].is_object()) Malformed(source, "\"shards\" is not an object");
  for (auto it = j["shards"].begin(); it != j["shards"].end(); ++it) {
    const std::string who = "tensor '" + it.key() + "'";
    const auto& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() ||
        !v.contains("global_shape") || !v.contains("pieces") || !v["pieces"].is_array()) {
      Malformed(source, who + " needs dtype, global_shape and pieces");
    }
    CheckpointTensor t;
    t.dtype = v["dtype"].get<std::string>();
    if (SafetensorsElementSize(t.dtype) == 0) {
      Malformed(source, who + ": unknown dtype '" + t.dtype + "'");
    }
    t.global_shape = ShapeField(v["global_shape"], source, who + " global_shape");
    for (const auto& p : v["pieces"]) {
      if (!p.is_object() || !p.contains("file") || !p["file"].is_string()) {
        Malformed(source, who + ": a piece needs a file");
      }
      CheckpointPiece piece;
      piece.file = p["file"].get<std::string>();
      if (piece.file.empty() || piece.file.find('/') != std::string::npos || piece.file == "." ||
          piece.file == "..") {
        Malformed(source, who + ": piece file '" + piece.file +
                              "' must be a file name inside the checkpoint's directory");
      }
      piece.offsets = ShapeField(p.value("offsets", nlohmann::json()), source, who + " offsets");
      piece.shape = ShapeField(p.value("shape", nlohmann::json()), source, who + " shape");
      t.pieces.push_back(std::move(piece));
    }
    index.tensors.emplace(it.key(), std::move(t));
  }
  const auto& weight_map = j["weight_map"];
  if (!weight_map.is_object()) Malformed(source, "\"weight_map\" is not an object");
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (index.tensors.count(it.key()) == 0) {
      Malformed(source, "weight_map names tensor '" + it.key() + "' that \"shards\" lacks");
    }
  }
  index.Validate(source);
  return index;
}

void CheckpointIndex::Validate(const std::string& source) const {
  for (const auto& [fqn, t] : tensors) {
    const std::string who = "tensor '" + fqn + "'";
    if (t.global_shape.empty()) {
      // A 0-dim tensor: exactly one piece, the whole scalar.
      if (t.pieces.size() != 1 || !t.pieces[0].shape.empty() || !t.pieces[0].offsets.empty()) {
        Malformed(source, who + " is 0-dim and must be one piece of shape []");
      }
      continue;
    }
    std::vector<const CheckpointPiece*> rows;
    for (const CheckpointPiece& p : t.pieces) {
      if (p.shape.size() != t.global_shape.size() || p.offsets.size() != t.global_shape.size()) {
        Malformed(source, who + ": piece in " + p.file + " of shape " + ShapeStr(p.shape) +
                              " at offsets " + ShapeStr(p.offsets) + " does not match global shape " +
                              ShapeStr(t.global_shape));
      }
      for (size_t d = 1; d < t.global_shape.size(); ++d) {
        if (p.offsets[d] != 0 || p.shape[d] != t.global_shape[d]) {
          Malformed(source, who + ": piece in " + p.file + " of shape " + ShapeStr(p.shape) +
                                " at offsets " + ShapeStr(p.offsets) +
                                " is not a dim-0 slice of global shape " + ShapeStr(t.global_shape));
        }
      }
      if (p.shape[0] > 0) rows.push_back(&p);
    }
    std::sort(rows.begin(), rows.end(), [](const CheckpointPiece* a, const CheckpointPiece* b) {
      return a->offsets[0] < b->offsets[0];
    });
    int64_t next = 0;
    for (const CheckpointPiece* p : rows) {
      if (p->offsets[0] != next) {
        Malformed(source, who + ": the piece in " + p->file + " starts at row " +
                              std::to_string(p->offsets[0]) + ", expected row " +
                              std::to_string(next) +
                              (p->offsets[0] < next ? " (overlapping pieces)" : " (missing rows)"));
      }
      next += p->shape[0];
    }
    if (next != t.global_shape[0]) {
      Malformed(source, who + ": the pieces cover " + std::to_string(next) + " of " +
                            std::to_string(t.global_shape[0]) + " rows (a missing shard?)");
    }
  }
}

std::vector<std::string> CheckpointIndex::files() const {
  std::set<std::string> names;
  for (const auto& [fqn, t] : tensors) {
    for (const CheckpointPiece& p : t.pieces) names.insert(p.file);
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> CheckpointIndex::keys_in(const std::string& file) const {
  std::vector<std::string> keys;
  for (const auto& [fqn, t] : tensors) {
    for (const CheckpointPiece& p : t.pieces) {
      if (p.file == file) {
        keys.push_back(fqn);
        break;
      }
    }
  }
  return keys;
}

std::string IndexFileName(const std::string& prefix) { return prefix + ".safetensors.index.json"; }

std::string FullFileName(const std::string& prefix) { return prefix + ".safetensors"; }

std::string ShardFileName(const std::string& prefix, int rank, int world_size, uint64_t hash) {
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return prefix + "-" + Padded(rank + 1) + "-of-" + Padded(world_size) + "-" + hex +
         ".safetensors";
}

bool IsShardFileName(const std::string& prefix, const std::string& name) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  static const std::regex kRest(R"(-[0-9]{5}-of-[0-9]{5}-[0-9a-f]{16}\.safetensors)");
  return std::regex_match(name.substr(prefix.size()), kRest);
}

uint64_t ContentHash(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace fsdp::serialization
