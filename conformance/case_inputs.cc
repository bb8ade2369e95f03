#include "conformance/case_inputs.h"

#include <set>

#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {

namespace {

const std::map<std::string, std::string>& FileMetadata() {
  static const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  return metadata;
}

NamedTensors DecodeTensors(const std::string& bytes, const std::string& source) {
  if (bytes.empty()) return {};
  return serialization::DecodeSafetensors(bytes, source).Tensors();
}

}  // namespace

NamedTensors WeightsOf(nn::Module& module, std::optional<DType> dtype) {
  NamedTensors weights;
  for (const auto& [key, tensor] : module.state_dict()) {
    weights.emplace_back(key, dtype && IsFloatingPoint(tensor.dtype()) ? tensor.to(*dtype).clone()
                                                                       : tensor.clone());
  }
  return weights;
}

std::string StepInputName(int64_t step) { return "step" + std::to_string(step) + "/input"; }
std::string StepTargetName(int64_t step) { return "step" + std::to_string(step) + "/target"; }
std::string RankInputsFileName(int rank) {
  return "rank" + std::to_string(rank) + ".inputs.safetensors";
}

RankInputs::RankInputs(nn::StateDict weights, NamedTensors tensors)
    : weights_(std::move(weights)), tensors_(std::move(tensors)) {}

const nn::StateDict& RankInputs::weights() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !weights_.empty(),
                  "this case has no model weights among its inputs");
  return weights_;
}

bool RankInputs::has(const std::string& name) const {
  for (const auto& [n, t] : tensors_) {
    if (n == name) return true;
  }
  return false;
}

const Tensor& RankInputs::Get(const std::string& name) const {
  for (const auto& [n, t] : tensors_) {
    if (n == name) return t;
  }
  std::string names;
  for (const auto& [n, t] : tensors_) names += (names.empty() ? "" : ", ") + n;
  FSDP_THROW(ErrorCode::kNotFound, "no input tensor '", name, "' for this rank (it has: ",
             names.empty() ? "none" : names, ")");
}

RankInputs RankInputs::Decode(const std::string& weights_bytes, const std::string& rank_bytes,
                              const std::string& source) {
  nn::StateDict weights;
  for (auto& [name, tensor] : DecodeTensors(weights_bytes, source + " " + kWeightsFile)) {
    weights.insert(name, std::move(tensor));
  }
  return RankInputs(std::move(weights), DecodeTensors(rank_bytes, source + " rank inputs"));
}

RankInputs RankInputs::Load(const std::string& weights_path, const std::string& rank_path) {
  nn::StateDict weights;
  if (!weights_path.empty()) {
    for (auto& [name, tensor] : serialization::LoadSafetensors(weights_path).Tensors()) {
      weights.insert(name, std::move(tensor));
    }
  }
  NamedTensors tensors;
  if (!rank_path.empty()) tensors = serialization::LoadSafetensors(rank_path).Tensors();
  return RankInputs(std::move(weights), std::move(tensors));
}

std::string CaseInputs::EncodeWeights() const {
  return weights.empty() ? std::string() : serialization::EncodeSafetensors(weights, FileMetadata());
}

std::string CaseInputs::EncodeRank(int rank) const {
  FSDP_CHECK(rank >= 0 && rank < static_cast<int>(ranks.size()), "CaseInputs: no rank ", rank,
             " (world ", ranks.size(), ")");
  return serialization::EncodeSafetensors(ranks[static_cast<size_t>(rank)], FileMetadata());
}

std::shared_ptr<const RankInputs> CaseInputs::ForRank(int rank) const {
  return std::make_shared<const RankInputs>(
      RankInputs::Decode(EncodeWeights(), EncodeRank(rank), "rank " + std::to_string(rank)));
}

std::vector<std::shared_ptr<const RankInputs>> CaseInputs::ForAllRanks() const {
  const std::string weights_bytes = EncodeWeights();
  std::vector<std::shared_ptr<const RankInputs>> out;
  out.reserve(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int rank = static_cast<int>(r);
    out.push_back(std::make_shared<const RankInputs>(
        RankInputs::Decode(weights_bytes, EncodeRank(rank), "rank " + std::to_string(rank))));
  }
  return out;
}

std::vector<std::map<std::string, std::string>> CaseInputs::WriteFiles(const std::string& dir) const {
  std::string weights_path;
  if (!weights.empty()) {
    weights_path = dir + "/" + kWeightsFile;
    serialization::WriteFileAtomically(weights_path, EncodeWeights());
  }
  std::vector<std::map<std::string, std::string>> out(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string path = dir + "/" + RankInputsFileName(static_cast<int>(r));
    serialization::WriteFileAtomically(path, EncodeRank(static_cast<int>(r)));
    if (!weights_path.empty()) out[r][kWeightsInput] = weights_path;
    out[r][kRankInput] = path;
  }
  return out;
}

void CaseInputs::Validate(const std::string& scenario, int world) const {
  FSDP_CHECK(static_cast<int>(ranks.size()) == world, "scenario ", scenario, " made inputs for ",
             ranks.size(), " ranks, but the world is ", world);
  auto check_names = [&](const NamedTensors& tensors, const std::string& what) {
    std::set<std::string> seen;
    for (const auto& [name, tensor] : tensors) {
      FSDP_CHECK(!name.empty() && seen.insert(name).second, "scenario ", scenario, ": ", what,
                 " has an empty or repeated tensor name '", name, "'");
      FSDP_CHECK(tensor.defined(), "scenario ", scenario, ": ", what, " tensor '", name,
                 "' is undefined");
    }
  };
  check_names(weights, "weights");
  for (int r = 0; r < world; ++r) check_names(ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

}  // namespace fsdp::conformance
