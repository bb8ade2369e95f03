// Observations: what a subject reports for one rank of one scenario case, as JSON, by the
// conventions of docs/scenarios.md ("Observation conventions"):
//
//   comm_counts  {"forward": {OP: n}, "backward": {OP: n}}   c10d / funcol op names
//   events       [[kind, fqn, training_state], ...]          e.g. ["unshard", "layers.0",
//   "FORWARD"] losses       [loss of step 0, loss of step 1, ...] tensors      {name: {"shape":
//   [..], "dtype": "float32", "data": [..]}} anything else: free-form extras the scenario's judge
//   reads.
//
// Subjects build these with the helpers below; judges read them with the accessors, which
// throw DataLoss naming the rank and the missing or malformed key (the runner turns a
// throwing judge into a failed case with that message).
// Thread-safety: stateless functions.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "engine/core/tensor.h"

namespace fsdp::conformance {

inline constexpr const char* kCommCounts = "comm_counts";
inline constexpr const char* kEvents = "events";
inline constexpr const char* kLosses = "losses";
inline constexpr const char* kTensors = "tensors";

// {"shape": [...], "dtype": "float32", "data": [...]} with the values in row-major order
// (floating types as doubles, int64 as integers). The tensor must have storage.
nlohmann::json TensorToJson(const Tensor& tensor);
// The same from plain values, for subjects that do not use fsdp::Tensor.
nlohmann::json TensorJson(const std::vector<int64_t>& shape, const std::string& dtype,
                          const std::vector<double>& data);

// The `tensors` of `observations` as engine tensors (each in its declared dtype), removed from
// the observations: what a process rank writes to its --tensors-output file. DataLoss naming
// `who` and the tensor when an entry is malformed.
NamedTensors TakeTensors(nlohmann::json& observations, const std::string& who);
// Adds `tensors` (read from a --tensors-output file) to observations["tensors"]; DataLoss
// naming `who` and the tensor when a name is already there.
void MergeTensors(nlohmann::json& observations, const NamedTensors& tensors, const std::string& who);

// The `comm_counts` value {"forward": {op: n}, "backward": {op: n}} from two CommDebugMode
// count tables (get_comm_counts()).
nlohmann::json PhaseCommCountsJson(const std::map<std::string, int64_t>& forward,
                                   const std::map<std::string, int64_t>& backward);

// ["unshard", "layers.0", "FORWARD"].
nlohmann::json EventJson(const std::string& kind, const std::string& fqn,
                         const std::string& training_state);

// Where two observations first differ, as "tensors.grad0/w.data[3]: 0.25 vs 0.2500000001" (keys
// in order, array elements by index, values printed as JSON; "" when they are equal).
std::string FirstDifference(const nlohmann::json& expected, const nlohmann::json& actual);

// Throws DataLoss when a conventional key is present with the wrong shape (so that a
// third-party driver's malformed output is reported as such, not as a wrong answer).
// `who` names the source in messages, e.g. "rank 2".
void ValidateObservations(const nlohmann::json& observations, const std::string& who);

// Accessors for judges. `per_rank[rank]` must be an object holding `key`.
const nlohmann::json& RankObservation(const std::vector<nlohmann::json>& per_rank, int rank,
                                      const std::string& key);
// The "data" of tensors[name] as doubles, checked against its shape.
std::vector<double> TensorData(const std::vector<nlohmann::json>& per_rank, int rank,
                               const std::string& name);
std::vector<int64_t> TensorShape(const std::vector<nlohmann::json>& per_rank, int rank,
                                 const std::string& name);
// comm_counts[phase][op], 0 when the op is absent from a present phase.
int64_t CommCount(const std::vector<nlohmann::json>& per_rank, int rank, const std::string& phase,
                  const std::string& op);
std::vector<double> Losses(const std::vector<nlohmann::json>& per_rank, int rank);

// Keeps only the conventional keys that the --json report carries (comm_counts, events,
// losses); null when none is present.
nlohmann::json ReportedObservations(const nlohmann::json& observations);

}  // namespace fsdp::conformance
