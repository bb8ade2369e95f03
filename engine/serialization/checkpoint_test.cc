// Checkpoint files: a sharded checkpoint saved at every world size of {1, 2, 3, 4, 8} loads at
// every other, bit-exact, with uneven dim 0; a full checkpoint loads sharded; every fault
// (truncated, corrupt, wrong dtype or shape, missing shard, missing or unexpected key, an index
// that does not tile) is an error naming the file and key and returns nothing; kill -9 of a
// saving process at random moments never leaves an unreadable checkpoint; the reference
// `safetensors` Python package reads a sharded checkpoint and writes one the reader loads.
// Expected rows come from torch.chunk's rule (ComputeShardInfo) for any size.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/core/bitwise_equal.h"
#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/serialization/atomic_file.h"
#include "engine/testing/safetensors_python.h"
#include "engine/serialization/checkpoint_reader.h"
#include "engine/serialization/checkpoint_writer.h"

namespace fsdp::serialization {
namespace {

namespace fs = std::filesystem;

// A model-like global state dict: uneven dim 0 for every world of the matrix, several dtypes,
// a 0-dim and a replicated entry. `seed` changes every value.
nn::StateDict GlobalDict(uint64_t seed, int64_t rows = 7) {
  Generator gen(seed);
  nn::StateDict sd;
  sd.insert("layers.0.weight", Tensor::randn({rows, 3}, DType::kFloat32, &gen));
  sd.insert("layers.0.bias", Tensor::randn({rows}, DType::kFloat32, &gen));
  sd.insert("emb.weight", Tensor::randn({5, 4}, DType::kFloat64, &gen));
  sd.insert("head.weight", Tensor::randn({9, 2}, DType::kFloat32, &gen).to(DType::kBFloat16));
  sd.insert("norm.weight", Tensor::randn({1, 2}, DType::kFloat16, &gen));
  sd.insert("step", Tensor::from_int64s({static_cast<int64_t>(seed)}, {}));
  sd.insert("ids", Tensor::from_int64s({1, 2, static_cast<int64_t>(seed)}, {3}));
  return sd;
}

// Rank `rank`'s view of `global` at `world`: every entry of dim >= 1 but "ids" becomes its
// torch.chunk rows with a ShardedEntry; the others stay full (replicated).
nn::StateDict ShardedView(const nn::StateDict& global, int rank, int world) {
  nn::StateDict out;
  for (const auto& [key, t] : global) {
    if (t.dim() == 0 || key == "ids") {
      out.insert(key, t.clone());
      continue;
    }
    const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(t.sizes(), rank, world);
    out.insert(key, t.narrow(0, info.row_begin, info.rows).clone());
    Shape offsets(t.sizes().size(), 0);
    offsets[0] = info.row_begin;
    out.sharded.insert(key, nn::ShardedEntry{t.sizes(), offsets});
  }
  return out;
}

// The same layout filled with zeros (what a freshly built model at another world holds).
nn::StateDict ZerosLike(const nn::StateDict& sd) {
  nn::StateDict out;
  for (const auto& [key, t] : sd) out.insert(key, Tensor::zeros(t.sizes(), t.dtype()));
  out.sharded = sd.sharded;
  return out;
}

void ExpectBitEqual(const nn::StateDict& got, const nn::StateDict& want, const std::string& what) {
  ASSERT_EQ(got.keys(), want.keys()) << what;
  for (const auto& [key, t] : want) {
    const Tensor& g = got.at(key);
    ASSERT_EQ(g.dtype(), t.dtype()) << what << " " << key;
    ASSERT_EQ(g.sizes(), t.sizes()) << what << " " << key;
    EXPECT_TRUE(BitwiseEqual(g, t)) << what << " " << key;
    const nn::ShardedEntry* gs = got.sharding(key);
    const nn::ShardedEntry* ws = want.sharding(key);
    ASSERT_EQ(gs == nullptr, ws == nullptr) << what << " " << key;
    if (ws != nullptr) {
      EXPECT_EQ(gs->global_shape, ws->global_shape);
      EXPECT_EQ(gs->offsets, ws->offsets);
    }
  }
}

// Saves `global` as a sharded checkpoint of `world` ranks into `dir` (each rank's file, then
// the commit, as the ranks of a job do).
CheckpointIndex SaveSharded(const fs::path& dir, const nn::StateDict& global, int world) {
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {
    files.push_back(WriteShardFile(dir.string(), "model", r, world, ShardedView(global, r, world)).file);
  }
  return CommitShardedCheckpoint(dir.string(), "model", world, files);
}

// Runs `f`, expecting an Error of `code` whose message names every one of `needles`.
template <typename F>
void ExpectError(F&& f, ErrorCode code, const std::vector<std::string>& needles) {
  try {
    f();
    FAIL() << "no error (expected one naming " << needles.front() << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& n : needles) {
      EXPECT_NE(e.message().find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("checkpoint_test." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path Sub(const std::string& name) {
    fs::create_directories(dir_ / name);
    return dir_ / name;
  }
  std::string Only(const std::string& prefix) {
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0) return name;
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(CheckpointTest, EveryWorldPairRoundTripsBitExact) {
  const std::vector<int> worlds = {1, 2, 3, 4, 8};
  for (int n : worlds) {
    const nn::StateDict global = GlobalDict(100 + static_cast<uint64_t>(n));
    const fs::path dir = Sub("n" + std::to_string(n));
    const CheckpointIndex index = SaveSharded(dir, global, n);
    EXPECT_EQ(index.world_size, n);
    CheckpointReader reader = CheckpointReader::Open(dir.string());
    for (int m : worlds) {
      for (int r = 0; r < m; ++r) {
        const nn::StateDict want = ShardedView(global, r, m);
        ExpectBitEqual(reader.Read(ZerosLike(want)), want,
                       "saved at " + std::to_string(n) + ", rank " + std::to_string(r) + " of " +
                           std::to_string(m));
      }
    }
    // And as full tensors (a plain model's state dict).
    ExpectBitEqual(reader.Read(ZerosLike(global)), global, "full from " + std::to_string(n));
  }
}

TEST_F(CheckpointTest, IndexFollowsTheHuggingFaceConventionAndRankFilesCarryTheirSharding) {
  const nn::StateDict global = GlobalDict(1);
  const int world = 3;
  const CheckpointIndex index = SaveSharded(dir_, global, world);
  const auto j = nlohmann::json::parse(ReadRegularFile((dir_ / "model.safetensors.index.json").string(), 1 << 20));
  uint64_t total = 0;
  for (const auto& [key, t] : global) total += t.nbytes();
  EXPECT_EQ(j["metadata"]["total_size"].get<uint64_t>(), total);
  for (const auto& [key, t] : global) {
    ASSERT_TRUE(j["weight_map"].contains(key)) << key;
    // The weight_map names the file holding row 0: rank 0's (its name says 00001-of-00003).
    EXPECT_EQ(j["weight_map"][key].get<std::string>().rfind("model-00001-of-00003-", 0), 0u) << key;
  }
  // Every rank's file: its pieces, global shapes and offsets in the metadata.
  for (const std::string& file : index.files()) {
    const SafetensorsFile f = LoadSafetensors((dir_ / file).string());
    const int rank = std::stoi(f.metadata.at("fsdp.rank"));
    EXPECT_EQ(f.metadata.at("fsdp.world_size"), std::to_string(world));
    EXPECT_EQ(file, ShardFileName("model", rank, world, ContentHash(ReadRegularFile((dir_ / file).string(), 1 << 20))));
    const auto sharding = nlohmann::json::parse(f.metadata.at(kShardingMetadataKey));
    const nn::StateDict view = ShardedView(global, rank, world);
    for (const auto& [key, t] : view) {
      const nn::ShardedEntry* s = view.sharding(key);
      if (s == nullptr) {
        EXPECT_EQ(f.Find(key) != nullptr, rank == 0) << "replicated " << key << " only on rank 0";
        continue;
      }
      ASSERT_NE(f.Find(key), nullptr) << file << " " << key;
      EXPECT_EQ(sharding[key]["global_shape"].get<Shape>(), s->global_shape);
      EXPECT_EQ(sharding[key]["offsets"].get<Shape>(), s->offsets);
      EXPECT_EQ(f.Find(key)->shape, t.sizes());
    }
  }
}

TEST_F(CheckpointTest, AResaveCommitsTheNewFilesAndRemovesTheOldOnes) {
  SaveSharded(dir_, GlobalDict(1), 4);
  const nn::StateDict second = GlobalDict(2);
  const CheckpointIndex index = SaveSharded(dir_, second, 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::string> want = index.files();
  want.push_back("model.safetensors.index.json");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  CheckpointReader reader = CheckpointReader::Open(dir_.string());
  ExpectBitEqual(reader.Read(ZerosLike(second)), second, "after resave");
}

TEST_F(CheckpointTest, AFullCheckpointIsOneFileAndLoadsSharded) {
  const nn::StateDict global = GlobalDict(5);
  SaveFullCheckpoint((dir_ / "model.safetensors").string(), global);
  CheckpointReader reader = CheckpointReader::Open(dir_.string());
  for (int r = 0; r < 3; ++r) {
    const nn::StateDict want = ShardedView(global, r, 3);
    ExpectBitEqual(reader.Read(ZerosLike(want)), want, "full file at rank " + std::to_string(r));
  }
  ExpectError([&] { SaveFullCheckpoint((dir_ / "x.safetensors").string(), ShardedView(global, 0, 2)); },
              ErrorCode::kInvalidArgument, {"layers.0.weight", "sharded"});
}

TEST_F(CheckpointTest, FaultsNameTheFileAndTheKeyAndLoadNothing) {
  const nn::StateDict global = GlobalDict(9);
  const CheckpointIndex index = SaveSharded(dir_, global, 2);
  const std::string rank1 = index.files()[1];  // sorted names: 00001 then 00002
  ASSERT_NE(rank1.find("-00002-of-00002-"), std::string::npos);
  const fs::path rank1_path = dir_ / rank1;
  const std::string good = ReadRegularFile(rank1_path.string(), 1 << 20);
  const nn::StateDict like = ZerosLike(ShardedView(global, 0, 1));
  auto read = [&] { CheckpointReader::Open(dir_.string()).Read(like); };

  // Truncated: DataLoss naming the file and the keys it holds.
  std::ofstream(rank1_path, std::ios::binary) << good.substr(0, good.size() - 3);
  ExpectError(read, ErrorCode::kDataLoss, {rank1, "truncated", "layers.0.weight"});
  // Corrupt header.
  std::string corrupt = good;
  corrupt[8] = '#';
  std::ofstream(rank1_path, std::ios::binary) << corrupt;
  ExpectError(read, ErrorCode::kDataLoss, {rank1, "does not start with '{'", "layers.0.bias"});
  // Missing shard file.
  fs::remove(rank1_path);
  ExpectError(read, ErrorCode::kNotFound, {rank1, "emb.weight"});
  // A file that disagrees with the index (another world's rank file under this name).
  const nn::StateDict other = ShardedView(global, 1, 3);
  const WrittenShard w = WriteShardFile(dir_.string(), "other", 1, 3, other);
  fs::rename(dir_ / w.file, rank1_path);
  ExpectError(read, ErrorCode::kDataLoss, {rank1, "tensor '", "but the index"});
  std::ofstream(rank1_path, std::ios::binary) << good;
  ExpectBitEqual(CheckpointReader::Open(dir_.string()).Read(like), ShardedView(global, 0, 1), "restored");

  // Wrong dtype and wrong shape of the state dict: InvalidArgument naming the key.
  nn::StateDict wrong_dtype = like;
  wrong_dtype.insert("emb.weight", Tensor::zeros({5, 4}, DType::kFloat32));
  ExpectError([&] { CheckpointReader::Open(dir_.string()).Read(wrong_dtype); },
              ErrorCode::kInvalidArgument, {"emb.weight", "F64", "F32", "model.safetensors.index.json"});
  nn::StateDict wrong_shape = like;
  wrong_shape.insert("layers.0.bias", Tensor::zeros({8}));
  wrong_shape.sharded.insert("layers.0.bias", nn::ShardedEntry{{8}, {0}});
  ExpectError([&] { CheckpointReader::Open(dir_.string()).Read(wrong_shape); },
              ErrorCode::kInvalidArgument, {"size mismatch for layers.0.bias", "[7]", "[8]"});
  // Missing and unexpected keys (strict), and a non-strict read that leaves the missing out.
  nn::StateDict extra = like;
  extra.insert("new.weight", Tensor::zeros({2}));
  ExpectError([&] { CheckpointReader::Open(dir_.string()).Read(extra); }, ErrorCode::kNotFound,
              {"Missing key(s)", "'new.weight'"});
  nn::StateDict fewer = like;
  fewer.erase("ids");
  ExpectError([&] { CheckpointReader::Open(dir_.string()).Read(fewer); }, ErrorCode::kNotFound,
              {"Unexpected key(s)", "'ids'"});
  EXPECT_EQ(CheckpointReader::Open(dir_.string()).Read(extra, /*strict=*/false).size(), like.size());

  // An index whose pieces no longer cover a tensor: DataLoss naming the index and the key.
  const fs::path index_path = dir_ / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(ReadRegularFile(index_path.string(), 1 << 20));
  j["shards"]["head.weight"]["pieces"].erase(1);
  std::ofstream(index_path) << j.dump();
  ExpectError(read, ErrorCode::kDataLoss, {"model.safetensors.index.json", "head.weight", "rows"});
  fs::remove(index_path);
  ExpectError(read, ErrorCode::kNotFound, {"no checkpoint", "model.safetensors.index.json"});
}

// The saving process of the kill -9 test: saves GlobalDict(v) at 3 ranks for v = first, ... .
[[noreturn]] void SaveForever(const fs::path& dir, uint64_t first) {
  for (uint64_t v = first;; ++v) SaveSharded(dir, GlobalDict(v, /*rows=*/4099), 3);
}

TEST_F(CheckpointTest, KillDashNineWhileSavingNeverLeavesAnUnreadableCheckpoint) {
  constexpr int kKills = 24;
  const uint64_t first = 1000;
  SaveSharded(dir_, GlobalDict(first, 4099), 3);
  const nn::StateDict like = ZerosLike(GlobalDict(0, 4099));
  std::mt19937 rng(15);
  uint64_t last = first;
  int advanced = 0;
  int stale_seen = 0;
  for (int i = 0; i < kKills; ++i) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        SaveForever(dir_, last + 1);
      } catch (...) {
      }
      ::_exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(1000, 90000)(rng)));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the saver ended by itself";
    // Files of an interrupted save (temporary or uncommitted shards) may be there; the
    // committed checkpoint must load and be exactly one saved version, not older than before.
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file() ? 1 : 0;
    stale_seen += files > 4 ? 1 : 0;
    const nn::StateDict got = CheckpointReader::Open(dir_.string()).Read(like);
    const uint64_t v = static_cast<uint64_t>(got.at("step").to_int64s()[0]);
    ASSERT_GE(v, last) << "kill " << i << ": the checkpoint went back";
    ExpectBitEqual(got, GlobalDict(v, 4099), "kill " + std::to_string(i));
    advanced += v > last ? 1 : 0;
    last = v;
  }
  // The kills must have hit saves in flight and between them; report what they found.
  RecordProperty("versions_committed", std::to_string(last - first));
  RecordProperty("kills_that_left_uncommitted_files", stale_seen);
  std::cout << kKills << " kills: " << advanced << " advanced the checkpoint, " << stale_seen
            << " left files of an interrupted save, " << (last - first) << " versions committed\n";
}

// The reference implementation reads a sharded checkpoint (index + rank files) and writes a
// full one the reader loads sharded. Python comes from $FSDP_PYTHON, else python3.
TEST_F(CheckpointTest, TheReferencePythonPackageReadsAndWritesCheckpoints) {
  std::string why_not;
  const std::optional<std::string> found = testing::PythonWithSafetensors(&why_not);
  if (!found) GTEST_SKIP() << why_not;
  const std::string& python = *found;
  nn::StateDict global = GlobalDict(3);
  global.erase("head.weight");  // numpy has no bfloat16
  const fs::path sharded = Sub("sharded");
  SaveSharded(sharded, global, 3);
  SaveFullCheckpoint((dir_ / "expected.safetensors").string(), global);
  const fs::path theirs = Sub("theirs");
  const std::string script = (dir_ / "check.py").string();
  std::ofstream(script) << R"(import json, os, sys, numpy as np
from safetensors.numpy import load_file, save_file
ckpt, expected, out = sys.argv[1:4]
index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
files = {f: load_file(os.path.join(ckpt, f)) for f in set(index["weight_map"].values())
         | {p["file"] for s in index["shards"].values() for p in s["pieces"]}}
want = load_file(expected)
assert set(index["weight_map"]) == set(want), (sorted(index["weight_map"]), sorted(want))
for name, spec in index["shards"].items():
    full = np.zeros(spec["global_shape"], dtype=want[name].dtype)
    for p in spec["pieces"]:
        piece = files[p["file"]][name]
        assert list(piece.shape) == p["shape"]
        if full.ndim == 0:
            full = piece
        else:
            full[p["offsets"][0]:p["offsets"][0] + p["shape"][0]] = piece
    assert full.tobytes() == want[name].tobytes(), name
save_file({"w": np.arange(15, dtype=np.float32).reshape(5, 3), "b": np.array([1.5, -2], dtype=np.float64)},
          os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
)";
  ASSERT_EQ(std::system((python + " " + script + " " + sharded.string() + " " +
                         (dir_ / "expected.safetensors").string() + " " + theirs.string())
                            .c_str()),
            0)
      << "the Python package rejected or misread the checkpoint in " << sharded;
  nn::StateDict python_global;
  python_global.insert("w", Tensor::arange(15, DType::kFloat32).view({5, 3}));
  python_global.insert("b", Tensor::from_doubles({1.5, -2}, {2}, DType::kFloat64));
  CheckpointReader reader = CheckpointReader::Open(theirs.string());
  for (int r = 0; r < 2; ++r) {
    nn::StateDict want = ShardedView(python_global, r, 2);
    ExpectBitEqual(reader.Read(ZerosLike(want)), want, "python's file at rank " + std::to_string(r));
  }
}

}  // namespace
}  // namespace fsdp::serialization
