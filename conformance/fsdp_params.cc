#include "conformance/fsdp_params.h"

#include <cctype>

#include "engine/core/error.h"

namespace fsdp::conformance {

ParamSpec ReshardAfterForwardAxis(const std::string& description) {
  return ParamSpec::Axis("reshard_after_forward", description, {"True", "False", "2"});
}

fsdp2::ReshardAfterForward ParseReshardAfterForward(const std::string& value) {
  if (value == "True") return true;
  if (value == "False") return false;
  bool digits = !value.empty() && value.size() <= 9;
  for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
  FSDP_CHECK(digits, "reshard_after_forward must be True, False or a positive integer; got '",
             value, "'");
  return std::stoi(value);
}

std::optional<std::string> SkipIntNotAFactor(const CaseParams& params, int world) {
  const std::string raf = params.GetString("reshard_after_forward");
  const fsdp2::ReshardAfterForward parsed = ParseReshardAfterForward(raf);
  const int* k = std::get_if<int>(&parsed);
  if (k == nullptr) return std::nullopt;
  if (*k < 1 || *k > world || world % *k != 0) {
    return "reshard_after_forward=" + raf + " is not a factor of world size " +
           std::to_string(world);
  }
  return std::nullopt;
}

}  // namespace fsdp::conformance
