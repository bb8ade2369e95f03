#include "engine/checkpoint/save_load.h"

#include <filesystem>

#include "engine/core/error.h"
#include "engine/serialization/checkpoint_reader.h"
#include "engine/serialization/checkpoint_writer.h"

namespace fsdp::checkpoint {

namespace {

// The number of ranks of `pg` whose `ok` is false (an all-reduce every rank takes part in).
int64_t FailedRanks(distributed::ProcessGroup& pg, bool ok) {
  Tensor failed = Tensor::from_int64s({ok ? 0 : 1}, {1}).to(pg.default_device());
  pg.all_reduce(failed)->wait();
  return failed.to_int64s()[0];
}

}  // namespace

void save(const nn::StateDict& state_dict, const std::string& dir, distributed::ProcessGroup& pg,
          const std::string& prefix) {
  const int rank = pg.rank();
  const int world = pg.size();
  // 1. This rank's file. A failure is carried to the others instead of leaving them waiting.
  std::string error;
  serialization::WrittenShard written;
  try {
    std::filesystem::create_directories(dir);
    written = serialization::WriteShardFile(dir, prefix, rank, world, state_dict);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // 2. Every rank's outcome and file hash ([ok, hash] per rank).
  Tensor mine = Tensor::from_int64s(
      {error.empty() ? 1 : 0, static_cast<int64_t>(written.hash)}, {2}).to(pg.default_device());
  Tensor all =
      Tensor::empty({2 * static_cast<int64_t>(world)}, DType::kInt64, pg.default_device());
  pg.all_gather_into_tensor(all, mine)->wait();
  const std::vector<int64_t> v = all.to_int64s();
  std::vector<std::string> files;
  std::vector<int> failed;
  for (int r = 0; r < world; ++r) {
    if (v[2 * r] == 0) failed.push_back(r);
    files.push_back(serialization::ShardFileName(prefix, r, world, static_cast<uint64_t>(v[2 * r + 1])));
  }
  // 3. The commit on rank 0, and its outcome to every rank.
  if (failed.empty() && rank == 0) {
    try {
      serialization::CommitShardedCheckpoint(dir, prefix, world, files);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  Tensor committed =
      Tensor::from_int64s({error.empty() || rank != 0 ? 1 : 0}, {1}).to(pg.default_device());
  pg.broadcast(committed, 0)->wait();
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, error.empty(), "checkpoint save to ", dir,
                  " failed on rank ", rank, ": ", error);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, failed.empty(), "checkpoint save to ", dir,
                  " failed on rank ", failed.empty() ? -1 : failed.front(),
                  " (see its error); the previous checkpoint is unchanged");
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, committed.to_int64s()[0] == 1, "checkpoint save to ",
                  dir, ": rank 0 could not commit the index (see its error); the previous "
                  "checkpoint is unchanged");
}

nn::StateDict load(const nn::StateDict& like, const std::string& dir,
                   distributed::ProcessGroup& pg, const std::string& prefix, bool strict) {
  nn::StateDict out;
  std::string error;
  ErrorCode code = ErrorCode::kInvalidArgument;
  try {
    out = serialization::CheckpointReader::Open(dir, prefix).Read(like, strict);
  } catch (const Error& e) {
    error = e.message();
    code = e.code();
  }
  const int64_t failed = FailedRanks(pg, error.empty());
  FSDP_CHECK_CODE(code, error.empty(), error);
  FSDP_CHECK_CODE(ErrorCode::kAborted, failed == 0, "checkpoint load from ", dir, ": ", failed,
                  " other rank(s) could not read their part (see their errors); nothing was loaded");
  return out;
}

}  // namespace fsdp::checkpoint
