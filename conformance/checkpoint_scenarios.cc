// Family `checkpoint` (issue #15, checkpoint files; docs/checkpoint.md):
//   round_trip  the case's world saves the fully_shard-ed MLP's sharded state dict as a sharded
//               checkpoint (per-rank .safetensors files + model.safetensors.index.json); the
//               checkpoint is then read at every world M of `load_worlds` for every rank of M
//               (bit-exact torch.chunk rows of the weights), and rank 0's full state dict saved
//               as model.safetensors reads the same way
//   faults      copies of the checkpoint broken one way each (rank file truncated in its header
//               or in its tensor bytes, corrupt header, missing rank file) and loads into a model
//               whose dict disagrees (wrong dtype, wrong shape, missing key, unexpected key): every
//               load fails on every rank with the error code of docs/checkpoint.md naming the file
//               and the key, and the model keeps its values
// The runner runs one world per case, so the load at another world M is done in the same case:
// the checkpoint is read (serialization::CheckpointReader) into the layout rank r' of M would
// have, for every r' of M, each rank taking the r' with r' % world == rank.
// The directory is a fresh temporary directory made by rank 0 and broadcast to the others (the
// ranks of a case share a file system), removed at the end.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "conformance/state_dict_model.h"
#include "engine/checkpoint/save_load.h"
#include "engine/checkpoint/state_dict.h"
#include "engine/core/bitwise_equal.h"
#include "engine/core/error.h"
#include "engine/functional/functional.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/checkpoint_index.h"
#include "engine/serialization/checkpoint_reader.h"
#include "engine/serialization/checkpoint_writer.h"

namespace fsdp::conformance {

namespace {

namespace fs = std::filesystem;

constexpr const char* kSeedDcp = "test_fully_shard_state_dict.py::TestFullyShardStateDictMultiProcess::";
constexpr int64_t kMaxPath = 1024;

// A temporary directory made by rank 0, known to every rank; removed by rank 0 on destruction
// after every rank is done with it.
class SharedTempDir {
 public:
  explicit SharedTempDir(distributed::ProcessGroup& pg) : pg_(pg) {
    Tensor chars = Tensor::zeros({kMaxPath}, DType::kInt64, pg.default_device());
    if (pg.rank() == 0) {
      std::string tmpl = (fs::temp_directory_path() / "fsdp-checkpoint.XXXXXX").string();
      FSDP_CHECK_CODE(ErrorCode::kUnavailable, ::mkdtemp(tmpl.data()) != nullptr,
                      "cannot create a temporary directory from ", tmpl);
      FSDP_CHECK(static_cast<int64_t>(tmpl.size()) < kMaxPath, "temporary path too long: ", tmpl);
      std::vector<int64_t> v(kMaxPath, 0);
      for (size_t i = 0; i < tmpl.size(); ++i) v[i] = static_cast<unsigned char>(tmpl[i]);
      chars = Tensor::from_int64s(v, {kMaxPath}).to(pg.default_device());
    }
    pg.broadcast(chars, 0)->wait();
    for (int64_t c : chars.to_int64s()) {
      if (c == 0) break;
      path_.push_back(static_cast<char>(c));
    }
  }
  ~SharedTempDir() {
    try {
      pg_.barrier();
    } catch (...) {
    }
    std::error_code ec;
    if (pg_.rank() == 0) fs::remove_all(path_, ec);
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  distributed::ProcessGroup& pg_;
  std::string path_;
};

std::vector<int> LoadWorlds(const CaseParams& p) {
  std::vector<int> worlds;
  std::stringstream ss(p.GetString("load_worlds"));
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto n = ParseInt(item);
    FSDP_CHECK(n && *n >= 1 && *n <= 64, "load_worlds: '", item, "' is not a world size in [1, 64]");
    worlds.push_back(static_cast<int>(*n));
  }
  FSDP_CHECK(!worlds.empty(), "load_worlds must name at least one world size");
  return worlds;
}

// The dict rank r' of `world` holds (zeros), laid out from the weights' shapes.
nn::StateDict LayoutAt(const NamedTensors& weights, int rank, int world) {
  nn::StateDict like;
  for (const auto& [key, t] : weights) {
    if (!IsShardedKey(key)) {
      like.insert(key, Tensor::zeros(t.sizes(), t.dtype()));
      continue;
    }
    const Tensor rows = ChunkRows(t, rank, world);
    like.insert(key, Tensor::zeros(rows.sizes(), t.dtype()));
    const nlohmann::json s = ChunkSharding(t, rank, world);
    like.sharded.insert(key, nn::ShardedEntry{s["global_shape"].get<Shape>(), s["offsets"].get<Shape>()});
  }
  return like;
}

std::string LoadName(const char* kind, int m, int r) {
  return std::string(kind) + std::to_string(m) + "/rank" + std::to_string(r) + "/";
}

// The JSON header of the safetensors file at `path`, parsed by the format's rule (an 8-byte
// little-endian length, then that many bytes of JSON) rather than by the engine's reader, so
// that a writer and a reader sharing one mistake cannot hide it. `buffer_aligned`, when given,
// receives whether the tensors' byte buffer starts 8-aligned (8 + the header length a multiple
// of 8: the header padded with spaces, as the format's writer does and docs/checkpoint.md says).
nlohmann::json RawSafetensorsHeader(const std::string& path, bool* buffer_aligned = nullptr) {
  const std::string bytes = serialization::ReadRegularFile(path, size_t{1} << 30);
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, bytes.size() >= 8, path, ": shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, n <= bytes.size() - 8, path, ": header length ", n,
                  " runs past the end of the file");
  if (buffer_aligned != nullptr) *buffer_aligned = (8 + n) % 8 == 0;
  return nlohmann::json::parse(bytes.substr(8, n));
}

// A rank file's name without its "-<16 hex digits>.safetensors" content hash.
std::string WithoutHash(const std::string& name) {
  constexpr size_t kHashSuffix = 1 + 16 + std::char_traits<char>::length(".safetensors");
  return name.size() > kHashSuffix ? name.substr(0, name.size() - kHashSuffix) : name;
}

// "model-<r + 1>-of-<world>", five digits each: rank r's file name before its hash
// (docs/checkpoint.md, Hugging Face's 1-based convention).
std::string RankFileStem(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d", rank + 1, world);
  return buf;
}

// The sharded checkpoint's files as written, read raw: the index's metadata and weight_map
// (each file name without its hash), and every rank file's __metadata__ (without the
// fsdp.sharding JSON, which the loads judge), the dtype of each of its tensors and whether its
// byte buffer starts 8-aligned, ordered by file name.
nlohmann::json RawCheckpointFiles(const std::string& dir) {
  const nlohmann::json index = nlohmann::json::parse(serialization::ReadRegularFile(
      dir + "/" + serialization::IndexFileName("model"), size_t{1} << 30));
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [key, file] : index.at("weight_map").items()) {
    weight_map[key] = WithoutHash(file.get<std::string>());
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (serialization::IsShardFileName("model", name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& name : names) {
    bool aligned = false;
    nlohmann::json header = RawSafetensorsHeader(dir + "/" + name, &aligned);
    nlohmann::json metadata = header.value("__metadata__", nlohmann::json::object());
    metadata.erase(serialization::kShardingMetadataKey);
    nlohmann::json dtypes = nlohmann::json::object();
    for (const auto& [key, entry] : header.items()) {
      if (key != "__metadata__") dtypes[key] = entry.value("dtype", "");
    }
    files.push_back({{"name", WithoutHash(name)},
                     {"metadata", metadata},
                     {"dtypes", dtypes},
                     {"buffer_aligned", aligned}});
  }
  return {{"metadata", index.at("metadata")}, {"weight_map", weight_map}, {"rank_files", files}};
}

// What RawCheckpointFiles reports for the MLP's checkpoint saved by `world` ranks, by
// docs/checkpoint.md's rules: total_size the bytes of every global tensor (float32), every
// tensor's first rows in rank 0's file, every rank file holding its piece of every parameter
// (the buffer, replicated, in rank 0's only) as "F32", its metadata naming its rank and the
// world, its byte buffer 8-aligned.
nlohmann::json ExpectedCheckpointFiles(const NamedTensors& weights, int world) {
  int64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [key, t] : weights) {
    total += t.numel() * 4;
    weight_map[key] = RankFileStem(0, world);
  }
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json dtypes = nlohmann::json::object();
    for (const auto& [key, t] : weights) {
      if (IsShardedKey(key) || r == 0) dtypes[key] = "F32";
    }
    files.push_back({{"name", RankFileStem(r, world)},
                     {"metadata",
                      {{"format", "pt"},
                       {"fsdp.rank", std::to_string(r)},
                       {"fsdp.world_size", std::to_string(world)}}},
                     {"dtypes", dtypes},
                     {"buffer_aligned", true}});
  }
  return {
      {"metadata",
       {{"total_size", total}, {"format", "fsdp-sharded"}, {"world_size", std::to_string(world)}}},
      {"weight_map", weight_map},
      {"rank_files", files}};
}

// The dtypes of the safetensors format's names (its specification), each written once by
// DtypesFile.
const std::vector<std::pair<DType, const char*>>& FormatDTypes() {
  static const std::vector<std::pair<DType, const char*>> kDTypes = {{DType::kFloat32, "F32"},
                                                                     {DType::kFloat64, "F64"},
                                                                     {DType::kFloat16, "F16"},
                                                                     {DType::kBFloat16, "BF16"},
                                                                     {DType::kInt64, "I64"}};
  return kDTypes;
}

// Rank 0 saves `weight` cast to every dtype of FormatDTypes as one full checkpoint `path`
// (keys: the dtypes' names); every rank then reports each key's dtype in the raw header and
// whether the engine's reader gives back exactly the tensor written.
nlohmann::json DtypesFile(const Tensor& weight, const std::string& path, int rank,
                          distributed::ProcessGroup& pg) {
  nn::StateDict written;
  for (const auto& [dtype, name] : FormatDTypes()) {
    written.insert(DTypeName(dtype), fsdp::mul(weight, 100.0).to(dtype));
  }
  if (rank == 0) serialization::SaveFullCheckpoint(path, written);
  pg.barrier();
  nn::StateDict like;
  for (const auto& [key, t] : written) like.insert(key, Tensor::zeros(t.sizes(), t.dtype()));
  const nn::StateDict got = serialization::CheckpointReader::Open(path).Read(like);
  const nlohmann::json header = RawSafetensorsHeader(path);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : written) {
    const Tensor* read = got.find(key);
    out[key] = {{"dtype", header.contains(key) ? header[key].value("dtype", "") : ""},
                {"read_back_exact",
                 read != nullptr && read->dtype() == t.dtype() && BitwiseEqual(*read, t)}};
  }
  return out;
}

Scenario RoundTrip() {
  Scenario s;
  s.info.name = "checkpoint/round_trip";
  s.info.description =
      "a sharded checkpoint saved at the case's world, and rank 0's full one, read bit-exact at "
      "every world of load_worlds (every rank of it)";
  s.info.seed_test = std::string(kSeedDcp) + "test_dp_state_dict_save_load";
  s.info.params = StateDictModelParams();
  s.info.params.push_back(ParamSpec::SizeString(
      "load_worlds", "comma-separated world sizes the checkpoint is read at", "1,2,3,4,8"));
  s.info.observations
      .Add(ObservationKey::Integer("rank_files", "rank files in the directory after the save"))
      .Add(ObservationKey::Integer("index_world_size", "the index's metadata.world_size"))
      .AddTensors({"load{name}/rank{name}/{fqn}", "float32", "rank r' of M's piece",
                   "the sharded checkpoint read into rank r' of world M's layout "
                   "(\"load<M>/rank<r'>/\", r' % world == this rank)"})
      .AddTensors({"full{name}/rank{name}/{fqn}", "float32", "rank r' of M's piece",
                   "model.safetensors (rank 0's full state dict) read the same way"})
      .Add(ObservationKey::Custom(
          "files", {{"type", "object"}},
          "the sharded checkpoint's files read raw (docs/checkpoint.md): {\"metadata\": the "
          "index's metadata, \"weight_map\": FQN -> file name without its hash, "
          "\"rank_files\": [{\"name\": without its hash, \"metadata\": the header's "
          "__metadata__ without fsdp.sharding, \"dtypes\": key -> header dtype, "
          "\"buffer_aligned\": whether 8 + the header length is a multiple of 8}] by name}"))
      .Add(ObservationKey::Custom(
          "dtypes_file", {{"type", "object"}},
          "a full checkpoint of in_proj.weight * 100 cast to float32, float64, float16, "
          "bfloat16 and int64 (keys: the dtype names): per key {\"dtype\": its dtype in the raw "
          "header, \"read_back_exact\": whether the reader returns the tensor written}"));
  s.info.default_world = 2;
  s.info.max_world = 8;
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}, {8, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    distributed::ProcessGroup& pg = env.group();
    nn::ModulePtr model = BuildShardedStateDictModel(env);
    SharedTempDir dir(pg);
    const std::string sharded = dir.path() + "/sharded";
    const std::string full = dir.path() + "/full";
    // A previous checkpoint in the directory first (the dict negated): the save replaces it,
    // and once its index is committed the previous rank files (other hashes) must be gone.
    checkpoint::save(ClonedStateDict(checkpoint::get_model_state_dict(*model), /*negate=*/true),
                     sharded, pg);
    checkpoint::save(checkpoint::get_model_state_dict(*model), sharded, pg);
    checkpoint::StateDictOptions rank0;
    rank0.full_state_dict = true;
    rank0.cpu_offload = true;
    const nn::StateDict full_sd = checkpoint::get_model_state_dict(*model, rank0);
    if (env.rank == 0) {
      fs::create_directories(full);
      serialization::SaveFullCheckpoint(full + "/model.safetensors", full_sd);
    }
    pg.barrier();
    nlohmann::json obs;
    int64_t rank_files = 0;
    for (const auto& e : fs::directory_iterator(sharded)) {
      rank_files += serialization::IsShardFileName("model", e.path().filename().string()) ? 1 : 0;
    }
    obs["rank_files"] = rank_files;
    obs["index_world_size"] = serialization::CheckpointReader::Open(sharded).index().world_size;
    obs["files"] = RawCheckpointFiles(sharded);
    obs[kTensors] = nlohmann::json::object();
    const NamedTensors weights = env.Inputs().weights().items();
    obs["dtypes_file"] = DtypesFile(env.Inputs().weights().at("in_proj.weight"),
                                    dir.path() + "/dtypes.safetensors", env.rank, pg);
    for (int m : LoadWorlds(env.params)) {
      for (int r = env.rank; r < m; r += env.world) {
        for (const auto& [kind, path] : {std::pair<const char*, std::string>{"load", sharded},
                                         std::pair<const char*, std::string>{"full", full}}) {
          const nn::StateDict got =
              serialization::CheckpointReader::Open(path).Read(LayoutAt(weights, r, m));
          for (const auto& [key, t] : got) obs[kTensors][LoadName(kind, m, r) + key] = TensorToJson(t);
        }
      }
    }
    return obs;
  };
  s.expect = [](const CaseParams& p, int world) {
    const NamedTensors weights = StateDictModelInputs(p, world).weights;
    std::vector<nlohmann::json> out;
    for (int rank = 0; rank < world; ++rank) {
      nlohmann::json obs;
      obs["rank_files"] = world;
      obs["index_world_size"] = world;
      obs["files"] = ExpectedCheckpointFiles(weights, world);
      obs["dtypes_file"] = nlohmann::json::object();
      for (const auto& [dtype, name] : FormatDTypes()) {
        obs["dtypes_file"][DTypeName(dtype)] = {{"dtype", name}, {"read_back_exact", true}};
      }
      obs[kTensors] = nlohmann::json::object();
      for (int m : LoadWorlds(p)) {
        for (int r = rank; r < m; r += world) {
          obs[kTensors].update(ExpectedPieces(weights, r, m, LoadName("load", m, r), p));
          obs[kTensors].update(ExpectedPieces(weights, r, m, LoadName("full", m, r), p));
        }
      }
      out.push_back(obs);
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const auto expected = expect(p, world);
    for (int r = 0; r < world; ++r) {
      CheckRankEqual(checks, per_rank, r, {"rank_files", "rank files", expected[r]["rank_files"]});
      CheckRankEqual(checks, per_rank, r,
                     {"index_world_size", "index world size", expected[r]["index_world_size"]});
      for (const char* part : {"metadata", "weight_map", "rank_files"}) {
        CheckRankEqual(checks, per_rank, r,
                       {"files", std::string("checkpoint files' ") + part,
                        expected[r]["files"][part], std::string("/") + part});
      }
      for (const auto& [dtype, name] : FormatDTypes()) {
        const std::string key = DTypeName(dtype);
        CheckRankEqual(checks, per_rank, r,
                       {"dtypes_file", key + " tensor in a full checkpoint",
                        expected[r]["dtypes_file"][key], "/" + key});
      }
      CheckRankTensorsExact(checks, per_rank, r, expected[r][kTensors]);
    }
  };
  return s;
}

// The faults of docs/checkpoint.md, each with the error code a load must fail with.
struct Fault {
  const char* name;
  const char* code;
};
constexpr Fault kFaults[] = {
    {"truncated", "DataLoss"},          {"truncated_tail", "DataLoss"},
    {"corrupt_header", "DataLoss"},     {"missing_shard", "NotFound"},
    {"wrong_dtype", "InvalidArgument"}, {"wrong_shape", "InvalidArgument"},
    {"missing_key", "NotFound"},        {"unexpected_key", "NotFound"},
    {"overlapping_pieces", "DataLoss"}, {"wrong_shape_on_last_rank", "InvalidArgument"},
    {"wide_offsets", "DataLoss"},       {"trailing_bytes", "DataLoss"},
    {"dtype_unlike_index", "DataLoss"}};

// wrong_shape_on_last_rank: only the last rank's dict disagrees (its own load fails with
// InvalidArgument); every other rank reads its part fine and must still fail, Aborted, as
// torch.distributed.checkpoint raises on every rank when one rank's planning fails.
constexpr const char* kOnLastRank = "wrong_shape_on_last_rank";
constexpr const char* kOtherRanksCode = "Aborted";

// Whether `fault` breaks rank 0's copy of the checkpoint (the others load into a changed dict).
bool IsBrokenCopy(const std::string& fault) {
  return fault == "truncated" || fault == "truncated_tail" || fault == "corrupt_header" ||
         fault == "missing_shard" || fault == "overlapping_pieces" || fault == "wide_offsets" ||
         fault == "trailing_bytes" || fault == "dtype_unlike_index";
}

// The key an error of `fault` must name.
std::string FaultKey(const std::string& fault) {
  if (fault == "missing_key") return "extra.weight";
  if (fault == "unexpected_key") return "out_proj.bias";
  return "in_proj.weight";
}

bool IsFileFault(const std::string& fault) {
  return fault == "truncated" || fault == "truncated_tail" || fault == "corrupt_header" ||
         fault == "missing_shard" || fault == "wide_offsets" || fault == "trailing_bytes" ||
         fault == "dtype_unlike_index";
}

// The last rank's file of the sharded checkpoint in `dir`.
std::string LastRankFile(const std::string& dir, int world) {
  const std::string prefix = serialization::ShardFileName("model", world - 1, world, 0).substr(0, 21);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) return name;
  }
  FSDP_THROW(ErrorCode::kNotFound, "no file ", prefix, "* in ", dir);
}

// The safetensors file `bytes` with its JSON header changed by `edit` and re-padded to 8-byte
// alignment (the format's rule, read raw as RawSafetensorsHeader does); `edit` may also change
// the tensors' byte buffer it is given.
std::string RewrittenHeader(
    const std::string& bytes,
    const std::function<void(nlohmann::ordered_json& header, std::string& data)>& edit) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(header, data);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  return out + text + data;
}

// The safetensors file `bytes` rewritten with `key`'s data_offsets `extra` bytes wider: `extra`
// zero bytes inserted after its bytes, every tensor after it moved by `extra`.
std::string WidenedOffsets(const std::string& bytes, const std::string& key, uint64_t extra) {
  return RewrittenHeader(bytes, [&](nlohmann::ordered_json& header, std::string& data) {
    const uint64_t end = header.at(key).at("data_offsets").at(1).get<uint64_t>();
    for (auto& item : header.items()) {
      if (item.key() == "__metadata__") continue;
      auto& offsets = item.value()["data_offsets"];
      if (item.key() == key) {
        offsets[1] = end + extra;
      } else if (offsets[0].get<uint64_t>() >= end) {
        offsets[0] = offsets[0].get<uint64_t>() + extra;
        offsets[1] = offsets[1].get<uint64_t>() + extra;
      }
    }
    data.insert(end, std::string(extra, '\0'));
  });
}

// Rank 0 breaks its copy `dir` of the checkpoint as `fault` says (IsBrokenCopy faults only).
// truncated: the last rank's file cut in half, so that its header length runs past the end;
// truncated_tail: only its last 4 bytes cut (the end of its last tensor's bytes), so that the
// header still parses and only a reader that checks the tensors' offsets against the bytes
// that follow it refuses it.
// wide_offsets: the last rank's file rewritten with in_proj.weight's data_offsets 4 bytes wider
// than its dtype and shape need (4 zero bytes inserted after its bytes, the later tensors moved
// by 4), so that the tensors still tile the buffer and only the per-tensor size check refuses it.
// dtype_unlike_index: the last rank's file relabels in_proj.weight from F32 to I32, a dtype of
// the same size, so that the file is valid on its own and its bytes read back the same; only a
// reader that checks each file's dtypes against the index's refuses it.
// trailing_bytes: 8 zero bytes appended to the last rank's file, after its last tensor's bytes:
// the header and every tensor still read, and only a reader that checks that the tensors end
// where the file ends (the format's rule: safetensors refuses it as MetadataIncompleteBuffer)
// refuses it.
// overlapping_pieces: the index places in_proj.weight's last piece one row early, so that its
// pieces overlap by one row and its last row is in none; the rows still add up to the global
// shape, so only a check that the pieces tile the rows (each starting where the previous ended)
// refuses it.
void Break(const std::string& dir, const std::string& fault, int world) {
  if (fault == "overlapping_pieces") {
    const std::string index = dir + "/model.safetensors.index.json";
    nlohmann::json j =
        nlohmann::json::parse(serialization::ReadRegularFile(index, size_t{1} << 30));
    nlohmann::json* last = nullptr;
    for (auto& piece : j["shards"]["in_proj.weight"]["pieces"]) {
      // The last piece that holds rows (torch.chunk leaves the last ranks empty at world 8).
      if (piece["shape"][0].get<int64_t>() == 0) continue;
      if (last == nullptr || piece["offsets"][0] > (*last)["offsets"][0]) last = &piece;
    }
    (*last)["offsets"][0] = (*last)["offsets"][0].get<int64_t>() - 1;
    std::ofstream(index, std::ios::binary | std::ios::trunc) << j.dump(2) << "\n";
    return;
  }
  const std::string path = dir + "/" + LastRankFile(dir, world);
  std::string bytes = serialization::ReadRegularFile(path, size_t{1} << 30);
  if (fault == "truncated") bytes.resize(bytes.size() / 2);
  if (fault == "truncated_tail") bytes.resize(bytes.size() - 4);
  if (fault == "wide_offsets") bytes = WidenedOffsets(bytes, "in_proj.weight", 4);
  if (fault == "corrupt_header") bytes[8] = '#';
  if (fault == "trailing_bytes") bytes.append(8, '\0');
  if (fault == "dtype_unlike_index") {
    bytes = RewrittenHeader(bytes, [](nlohmann::ordered_json& header, std::string&) {
      header.at("in_proj.weight")["dtype"] = "I32";
    });
  }
  if (fault == "missing_shard") {
    fs::remove(path);
    return;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The model's dict as the load sees it, changed as a key/dtype/shape fault says.
nn::StateDict LikeFor(const nn::StateDict& sd, std::string fault, int rank, int world) {
  if (fault == kOnLastRank) fault = rank == world - 1 ? "wrong_shape" : "";
  nn::StateDict like = sd;
  const nn::ShardedEntry entry = *sd.sharding("in_proj.weight");
  if (fault == "wrong_dtype") {
    like.insert("in_proj.weight", sd.at("in_proj.weight").to(DType::kFloat64));
    like.sharded.insert("in_proj.weight", entry);
  }
  if (fault == "wrong_shape") {
    nn::ShardedEntry wider = entry;
    wider.global_shape[1] += 1;
    const Tensor& t = sd.at("in_proj.weight");
    like.insert("in_proj.weight", Tensor::zeros({t.size(0), t.size(1) + 1}, t.dtype()));
    like.sharded.insert("in_proj.weight", wider);
  }
  if (fault == "missing_key") like.insert("extra.weight", Tensor::zeros({2}));
  if (fault == "unexpected_key") like.erase("out_proj.bias");
  return like;
}

// Saves that must fail on every rank and leave the checkpoint already in the directory as it
// was (docs/checkpoint.md, "Commit protocol"), each saving the model's dict negated so that a
// save that commits anyway would load other values:
//   save_wrong_slice_on_last_rank         the last rank's in_proj.weight claims a piece that is
//                                         not a dim-0 slice: its own write fails, every other
//                                         rank must fail too, naming it, and nobody commits
//   save_other_global_shape_on_last_rank  the last rank's in_proj.weight claims one more global
//                                         row (its piece still a dim-0 slice of it): rank 0's
//                                         commit finds the rank files disagreeing and fails,
//                                         and every rank with it, naming rank 0
struct SaveFault {
  const char* name;
  bool blames_last_rank;  // the rank an error must name: the last rank, else rank 0
};
constexpr SaveFault kSaveFaults[] = {{"save_wrong_slice_on_last_rank", true},
                                     {"save_other_global_shape_on_last_rank", false}};

// The dict `rank` saves for `fault`: the model's, negated, changed on the last rank only.
nn::StateDict SaveDictFor(const nn::StateDict& sd, const std::string& fault, int rank, int world) {
  nn::StateDict out = ClonedStateDict(sd, /*negate=*/true);
  if (rank != world - 1) return out;
  nn::ShardedEntry entry = *sd.sharding("in_proj.weight");
  if (fault == "save_wrong_slice_on_last_rank") entry.offsets[1] = 1;
  if (fault == "save_other_global_shape_on_last_rank") entry.global_shape[0] += 1;
  out.sharded.insert("in_proj.weight", entry);
  return out;
}

// Every save fault of kSaveFaults into a copy of the checkpoint `good` (made by rank 0 as
// `dir`/<fault>): the save's error code, whether it names the rank at fault, and whether the
// directory still loads the model's own values afterwards.
nlohmann::json RunSaveFaults(nn::Module& model, const std::string& dir, const std::string& good,
                             RankEnv& env) {
  distributed::ProcessGroup& pg = env.group();
  if (env.rank == 0) {
    for (const SaveFault& f : kSaveFaults) {
      const std::string copy = dir + "/" + f.name;
      fs::create_directories(copy);
      fs::copy(good, copy, fs::copy_options::recursive);
    }
  }
  pg.barrier();
  nlohmann::json out = nlohmann::json::object();
  for (const SaveFault& f : kSaveFaults) {
    const std::string copy = dir + "/" + f.name;
    const nn::StateDict sd = checkpoint::get_model_state_dict(model);
    nlohmann::json result = {{"code", nullptr}, {"names_rank", false}};
    try {
      checkpoint::save(SaveDictFor(sd, f.name, env.rank, env.world), copy, pg);
    } catch (const Error& e) {
      result["code"] = ErrorCodeName(e.code());
      result["names_rank"] = NamesRank(e.message(), f.blames_last_rank ? env.world - 1 : 0);
    }
    bool kept = true;
    const nn::StateDict loaded = checkpoint::load(sd, copy, pg);
    for (const auto& [key, value] : sd) {
      const Tensor* got = loaded.find(key);
      kept &= got != nullptr && BitwiseEqual(*got, value);
    }
    result["previous_kept"] = kept;
    out[f.name] = result;
  }
  return out;
}

Scenario Faults() {
  Scenario s;
  s.info.name = "checkpoint/faults";
  s.info.description =
      "loads of a broken checkpoint (truncated in the header or in the tensor bytes, corrupt "
      "header, a tensor's data_offsets wider than its shape, bytes after the last tensor's, a "
      "rank file's dtype unlike the index's, "
      "missing rank file, an index whose "
      "pieces overlap) or into a "
      "disagreeing dict (dtype, shape, missing or unexpected key; a wider tensor on the last "
      "rank only) fail on every rank, naming the file and the key (the other ranks of a one-rank "
      "fault: Aborted), and load nothing; saves whose last rank's dict is inconsistent (not a "
      "dim-0 slice, another global shape) fail on every rank, naming the rank at fault, and "
      "leave the previous checkpoint loadable";
  s.info.seed_test = std::string(kSeedDcp) + "test_dp_state_dict_save_load";
  s.info.params = StateDictModelParams();
  s.info.observations.Add(ObservationKey::Custom(
      "faults", {{"type", "object"}},
      "per fault: {\"code\": the load's ErrorCode name (null when it loaded), \"names_file\", "
      "\"names_key\": whether the message names the broken file (the index for dict faults) "
      "and the key, \"unchanged\": whether the model kept its values}"));
  s.info.observations.Add(ObservationKey::Custom(
      "save_faults", {{"type", "object"}},
      "per save fault (a save into a copy of a good checkpoint whose last rank's dict is "
      "inconsistent): {\"code\": the save's ErrorCode name (null when it saved), "
      "\"names_rank\": whether the message names the rank at fault (the last rank, or rank 0 "
      "whose commit found the files disagreeing), \"previous_kept\": whether the directory "
      "still loads the model's own values}"));
  s.info.default_world = 2;
  s.info.max_world = 8;
  s.info.test_runs = {{1, {}}, {3, {}}, {4, {}}};
  s.info.inputs = StateDictModelInputsDoc();
  s.inputs = StateDictModelInputs;
  s.run_rank = [](RankEnv& env) {
    distributed::ProcessGroup& pg = env.group();
    nn::ModulePtr model = BuildShardedStateDictModel(env);
    SharedTempDir dir(pg);
    const std::string good = dir.path() + "/good";
    checkpoint::save(checkpoint::get_model_state_dict(*model), good, pg);
    if (env.rank == 0) {
      for (const Fault& f : kFaults) {
        const std::string copy = dir.path() + "/" + f.name;
        fs::create_directories(copy);
        fs::copy(good, copy, fs::copy_options::recursive);
        if (IsBrokenCopy(f.name)) Break(copy, f.name, env.world);
      }
    }
    pg.barrier();
    const std::string last_file = LastRankFile(good, env.world);
    nlohmann::json faults = nlohmann::json::object();
    for (const Fault& f : kFaults) {
      const nn::StateDict before = model->state_dict();
      std::vector<Tensor> snapshot;
      for (const auto& [k, v] : before) snapshot.push_back(v.clone());
      nlohmann::json result = {{"code", nullptr}, {"names_file", false}, {"names_key", false}};
      try {
        const nn::StateDict like =
            LikeFor(checkpoint::get_model_state_dict(*model), f.name, env.rank, env.world);
        checkpoint::set_model_state_dict(
            *model, checkpoint::load(like, dir.path() + "/" + f.name, pg));
      } catch (const Error& e) {
        const std::string file = IsFileFault(f.name) ? last_file : "model.safetensors.index.json";
        result["code"] = ErrorCodeName(e.code());
        result["names_file"] = e.message().find(file) != std::string::npos;
        result["names_key"] = e.message().find(FaultKey(f.name)) != std::string::npos;
      }
      bool unchanged = true;
      size_t i = 0;
      for (const auto& [k, v] : model->state_dict()) {
        const Tensor& was = snapshot[i++];
        unchanged &= BitwiseEqual(v, was);
      }
      result["unchanged"] = unchanged;
      faults[f.name] = result;
    }
    nlohmann::json obs;
    obs["faults"] = faults;
    obs["save_faults"] = RunSaveFaults(*model, dir.path(), good, env);
    return obs;
  };
  s.expect = [](const CaseParams&, int world) {
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      nlohmann::json faults = nlohmann::json::object();
      for (const Fault& f : kFaults) {
        faults[f.name] = {
            {"code", f.code}, {"names_file", true}, {"names_key", true}, {"unchanged", true}};
        if (std::string(f.name) == kOnLastRank && r != world - 1) {
          faults[f.name] = {{"code", kOtherRanksCode},
                            {"names_file", false},
                            {"names_key", false},
                            {"unchanged", true}};
        }
      }
      nlohmann::json save_faults = nlohmann::json::object();
      for (const SaveFault& f : kSaveFaults) {
        save_faults[f.name] = {
            {"code", "Unavailable"}, {"names_rank", true}, {"previous_kept", true}};
      }
      out.push_back({{"faults", faults}, {"save_faults", save_faults}});
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const auto expected = expect(p, world);
    for (int r = 0; r < world; ++r) {
      for (const Fault& f : kFaults) {
        CheckRankEqual(checks, per_rank, r,
                       {"faults", std::string(f.name) + " load", expected[r]["faults"][f.name],
                        std::string("/") + f.name});
      }
      for (const SaveFault& f : kSaveFaults) {
        CheckRankEqual(
            checks, per_rank, r,
            {"save_faults", f.name, expected[r]["save_faults"][f.name], std::string("/") + f.name});
      }
    }
  };
  return s;
}

}  // namespace

void RegisterCheckpointScenarios(ScenarioRegistry& registry) {
  registry.Add(RoundTrip());
  registry.Add(Faults());
}

}  // namespace fsdp::conformance
