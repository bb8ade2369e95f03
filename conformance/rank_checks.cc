// Per-rank checks of judges (rank_checks.h).
// Thread-safety: stateless functions over the caller's CheckList.
#include "conformance/rank_checks.h"

#include <cctype>

#include "conformance/observations.h"

namespace fsdp::conformance {

std::string RankName(int rank) { return "rank " + std::to_string(rank); }

bool NamesRank(const std::string& message, int rank) {
  const std::string name = RankName(rank);
  for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
    const size_t end = at + name.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
      return true;
    }
  }
  return false;
}

bool CheckRankEqual(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                    const RankCheck& check) {
  const nlohmann::json& observed = RankObservation(per_rank, rank, check.key);
  const std::string name = RankName(rank) + " " + check.what;
  if (!check.path) return checks.CheckEqual(name, check.expected, observed);
  const nlohmann::json::json_pointer pointer(*check.path);
  return checks.CheckEqual(name, check.expected,
                           observed.contains(pointer) ? observed.at(pointer) : nlohmann::json());
}

void CheckEveryRank(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int world,
                    const std::vector<RankCheck>& rank_checks) {
  for (int r = 0; r < world; ++r) {
    for (const RankCheck& check : rank_checks) CheckRankEqual(checks, per_rank, r, check);
  }
}

std::optional<std::string> CheckRankError(CheckList& checks,
                                          const std::vector<nlohmann::json>& per_rank, int rank,
                                          const std::string& code, const std::string& missing_what,
                                          const std::string& missing_detail) {
  const nlohmann::json& error = RankObservation(per_rank, rank, "error");
  if (error.is_null()) {
    checks.Fail(RankName(rank) + " " + missing_what, missing_detail);
    return std::nullopt;
  }
  checks.CheckEqual(RankName(rank) + " error code", code, error.at("code"));
  return error.at("message").get<std::string>();
}

bool CheckRankFailed(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                     const std::string& what) {
  const nlohmann::json& error = RankObservation(per_rank, rank, "error");
  const bool failed = !error.is_null();
  checks.CheckTrue(RankName(rank) + " " + what, failed,
                   failed ? error.at("code").get<std::string>() + ": " +
                                error.at("message").get<std::string>()
                          : "the rank reported no error");
  return failed;
}

bool CheckRankTensorExact(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                          const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& shape, const std::vector<double>& data) {
  const std::string who = RankName(rank) + " " + name;
  const nlohmann::json& tensors = RankObservation(per_rank, rank, kTensors);
  if (!tensors.is_object() || !tensors.contains(name)) {
    std::string present;
    if (tensors.is_object()) {
      for (auto it = tensors.begin(); it != tensors.end(); ++it) {
        present += (present.empty() ? "" : ", ") + it.key();
      }
    }
    checks.Fail(who, "the rank reported no tensor '" + name + "' (tensors: " +
                         (present.empty() ? "none" : present) + ")");
    return false;
  }
  const std::vector<int64_t> actual_shape = TensorShape(per_rank, rank, name);
  const bool same_form =
      checks.CheckEqual(who + " dtype and shape", nlohmann::json({dtype, shape}),
                        nlohmann::json({tensors.at(name).at("dtype"), actual_shape}));
  if (!same_form) return false;
  return checks.CheckClose(who + " values", data, TensorData(per_rank, rank, name),
                           Tolerance{0, 0});
}

bool CheckRankTensorsExact(CheckList& checks, const std::vector<nlohmann::json>& per_rank,
                           int rank, const nlohmann::json& expected) {
  bool all = true;
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    all = CheckRankTensorExact(checks, per_rank, rank, it.key(),
                               it->at("dtype").get<std::string>(),
                               it->at("shape").get<std::vector<int64_t>>(),
                               it->at("data").get<std::vector<double>>()) &&
          all;
  }
  return all;
}

}  // namespace fsdp::conformance
