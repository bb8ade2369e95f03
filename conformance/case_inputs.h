// CaseInputs: the tensors the runner owns for one case: the model's initial weights and every
// rank's per-step inputs and targets. A scenario that trains or runs a model declares them
// (Scenario::inputs, a pure function of the case's parameters and world size); the runner
// builds them once per case and hands every subject the same bytes:
//
//   * ranks as processes (gloo, nccl, external drivers): the run directory gets
//     `weights.safetensors` (every key of the model's state dict, tied parameters under each of
//     their keys, in the case's dtype; metadata {"format": "pt"}) and, per rank,
//     `rankR.inputs.safetensors` (that rank's tensors); the driver protocol names them
//     (`--input weights=FILE --input rank=FILE`, and "inputs" in the request JSON);
//   * ranks as threads (in-process subjects, the engine included): the same files' bytes,
//     encoded and decoded by the same safetensors code, without touching the disk.
//
// Either way a rank reads them through RankInputs (RankEnv::Inputs()): weights() as a state
// dict to load_state_dict, Get("step0/input") for a named tensor. Names of per-rank tensors are
// scenario-defined and listed in the scenario's schema; the conventions are StepInputName and
// StepTargetName.
//
// Ownership: values; a RankInputs is shared (std::shared_ptr<const>) with the rank's body.
// Thread-safety: immutable after construction; its tensors must not be written to (bodies copy
// or move them to their device).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conformance/observation_schema.h"
#include "engine/core/tensor.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

inline constexpr const char* kWeightsInput = "weights";  // --input weights=FILE
inline constexpr const char* kRankInput = "rank";        // --input rank=FILE
inline constexpr const char* kWeightsFile = "weights.safetensors";

// "step<k>/input": the rank's model input of step k (its slice of the global batch).
std::string StepInputName(int64_t step);
// "step<k>/target": the rank's target of step k, for scenarios whose loss takes one.
std::string StepTargetName(int64_t step);
// "rank<R>.inputs.safetensors".
std::string RankInputsFileName(int rank);

// What Scenario::inputs makes, in words, for drivers (docs/observations.md, `fsdp-conform
// list --json`): the weights file and each rank's tensors.
struct InputsDoc {
  // What weights.safetensors holds, e.g. "the state dict of the Transformer (...), in the
  // case's dtype"; empty: no weights file.
  std::string weights;
  // The rank file's tensors by name pattern (placeholders as TensorObservation's).
  std::vector<TensorObservation> rank_tensors;
  bool empty() const { return weights.empty() && rank_tensors.empty(); }
};

// Every entry of module.state_dict() (tied parameters under each of their keys), copied, as a
// case's weights; floating entries converted to `dtype` when given, others (int64 buffers) kept.
NamedTensors WeightsOf(nn::Module& module, std::optional<DType> dtype = std::nullopt);

// What one rank reads.
class RankInputs {
 public:
  RankInputs(nn::StateDict weights, NamedTensors tensors);

  // The model's initial state dict; FailedPrecondition when the case has no weights.
  const nn::StateDict& weights() const;
  bool has_weights() const { return !weights_.empty(); }
  // The rank's tensor `name`; NotFound naming it and listing the names present.
  const Tensor& Get(const std::string& name) const;
  bool has(const std::string& name) const;
  const NamedTensors& tensors() const { return tensors_; }

  // From the bytes of the two files (either may be empty: no such file); `source` prefixes
  // error messages.
  static RankInputs Decode(const std::string& weights_bytes, const std::string& rank_bytes,
                           const std::string& source);
  // From the files the driver protocol names (an empty path: none). DataLoss / NotFound naming
  // the file when one is unreadable.
  static RankInputs Load(const std::string& weights_path, const std::string& rank_path);

 private:
  nn::StateDict weights_;
  NamedTensors tensors_;
};

// The whole case's inputs, as the scenario made them.
struct CaseInputs {
  NamedTensors weights;             // state-dict keys -> tensors; empty: no model weights
  std::vector<NamedTensors> ranks;  // ranks[r]: rank r's tensors; size == world

  // The files' bytes: the weights file (empty string when there are no weights) and rank r's.
  std::string EncodeWeights() const;
  std::string EncodeRank(int rank) const;
  // Rank r's view, through the files' bytes (the in-process path).
  std::shared_ptr<const RankInputs> ForRank(int rank) const;
  // Every rank's view, element r for rank r: the weights file encoded once, each rank's decoded
  // into its own tensors.
  std::vector<std::shared_ptr<const RankInputs>> ForAllRanks() const;
  // Writes weights.safetensors (when there are weights) and every rankR.inputs.safetensors to
  // `dir`; returns per rank its `--input` map {"weights": path, "rank": path}.
  std::vector<std::map<std::string, std::string>> WriteFiles(const std::string& dir) const;
  // Checks the shape: `world` rank lists, names non-empty and unique. InvalidArgument naming
  // `scenario` otherwise.
  void Validate(const std::string& scenario, int world) const;
};

}  // namespace fsdp::conformance
