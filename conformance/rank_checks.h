// Per-rank checks: what judges do for every rank of a case. They read one rank's observation
// (RankObservation: DataLoss naming the rank and key when it is missing) and record a check
// in a CheckList whose name starts with the rank ("rank 2 forward events"), with the expected
// and the actual value, so that a failed check says which rank, what and expected vs got.
//
//   CheckEveryRank(checks, per_rank, world,
//                  {{"forward_events", "forward events", expected_forward},
//                   {"backward_events", "backward events", expected_backward}});
//
// records, for rank 0, 1, ... in turn, "rank r forward events" then "rank r backward events".
//
// Ownership: the functions borrow the CheckList and the observations for the call.
// Thread-safety: none beyond CheckList's (one judge fills one list).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/checks.h"

namespace fsdp::conformance {

// "rank 3": how check names and messages name a rank.
std::string RankName(int rank);
// True when `message` names rank `rank` ("rank 3" not followed by another digit).
bool NamesRank(const std::string& message, int rank);

// One per-rank equality: the rank's observation `key` (or, when `path` is set, the value at
// that JSON pointer inside it: "/forward" for a member, "/2" for an element; null when
// absent) must equal `expected`. The check is named "rank <r> <what>".
struct RankCheck {
  std::string key;
  std::string what;
  nlohmann::json expected;
  std::optional<std::string> path;  // Default: none (the whole observation)
};

// Records `check` for `rank`. Returns the verdict.
bool CheckRankEqual(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                    const RankCheck& check);
// Records every one of `rank_checks` for rank 0, then for rank 1, ... up to world - 1.
void CheckEveryRank(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int world,
                    const std::vector<RankCheck>& rank_checks);

// The rank's "error" observation (null, or {"code": ErrorCode name, "message": ...}) must be
// an error with `code`. When it is null, records a failed check "rank <r> <missing_what>"
// with `missing_detail` and returns nullopt; otherwise records "rank <r> error code" and
// returns the error's message (for the caller's checks of its wording).
std::optional<std::string> CheckRankError(CheckList& checks,
                                          const std::vector<nlohmann::json>& per_rank, int rank,
                                          const std::string& code, const std::string& missing_what,
                                          const std::string& missing_detail);

// The rank's "error" observation must be an error, whatever its code and message (for calls
// that PyTorch promises to fail without saying how). Records "rank <r> <what>" with the error
// ("Code: message") or "the rank reported no error" as detail; returns the verdict.
bool CheckRankFailed(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                     const std::string& what);

// The rank's tensor `name` (in its `tensors` observation) must have dtype `dtype`, shape
// `shape` and exactly the values `data` (row-major; NaN matches NaN). Records "rank <r> <name>
// dtype and shape" and "rank <r> <name> values" (the latter only when the shape matches), or
// one failed check "rank <r> <name>" naming the tensors present when the rank reported no
// such tensor. Returns the verdict.
bool CheckRankTensorExact(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                          const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& shape, const std::vector<double>& data);
// CheckRankTensorExact for every entry of `expected` ({name: {"shape", "dtype", "data"}}, as
// TensorToJson / TensorJson make them), in the object's order. Returns whether all passed.
bool CheckRankTensorsExact(CheckList& checks, const std::vector<nlohmann::json>& per_rank,
                           int rank, const nlohmann::json& expected);

}  // namespace fsdp::conformance
