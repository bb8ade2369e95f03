#include "engine/fsdp/semantics.h"

#include "engine/core/error.h"

namespace fsdp::fsdp2 {

namespace {

constexpr Semantics kAll[] = {Semantics::kTorch2_4, Semantics::kTorch2_8, Semantics::kTorch2_15};

}  // namespace

const char* SemanticsName(Semantics semantics) {
  switch (semantics) {
    case Semantics::kTorch2_4:
      return "torch-2.4";
    case Semantics::kTorch2_8:
      return "torch-2.8";
    case Semantics::kTorch2_15:
      return "torch-2.15";
  }
  return "?";
}

std::vector<std::string> SemanticsNames() {
  std::vector<std::string> names;
  for (Semantics s : kAll) names.emplace_back(SemanticsName(s));
  return names;
}

std::optional<Semantics> FindSemantics(const std::string& name) {
  for (Semantics s : kAll) {
    if (name == SemanticsName(s)) return s;
  }
  return std::nullopt;
}

Semantics ParseSemantics(const std::string& name) {
  const std::optional<Semantics> found = FindSemantics(name);
  if (!found) {
    std::string known;
    for (const std::string& n : SemanticsNames()) known += (known.empty() ? "" : ", ") + n;
    FSDP_THROW(ErrorCode::kInvalidArgument, "unknown FSDP semantics '", name,
               "'; known profiles: ", known);
  }
  return *found;
}

bool HasReshardAfterForwardNone(Semantics semantics) {
  return semantics != Semantics::kTorch2_4;
}

bool EndOfBackwardSweepsEveryGroup(Semantics semantics) {
  return semantics != Semantics::kTorch2_4;
}

bool ReducesInParamDtypeWhenReduceDtypeUnset(Semantics semantics) {
  return semantics != Semantics::kTorch2_15;
}

bool KeepsUnshardedGradInReduceDtype(Semantics semantics) {
  // One PyTorch change with the reduce dtype's (2.15's FSDPParam.unsharded_grad_dtype).
  return !ReducesInParamDtypeWhenReduceDtypeUnset(semantics);
}

bool DtypeChecksCoverFrozenParams(Semantics semantics) { return semantics == Semantics::kTorch2_4; }

bool LazyInitKeepsRootUnsharded(Semantics semantics, bool auto_reshard_after_forward) {
  if (semantics == Semantics::kTorch2_4) return true;
  return auto_reshard_after_forward;
}

}  // namespace fsdp::fsdp2
