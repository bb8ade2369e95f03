// The fully_shard knobs that FSDP scenario families share as parameters: the
// `reshard_after_forward` axis (True, False or an int factor), its parsing, and the skip rule
// for an int that is not a factor of the world size. Stateless; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "conformance/params.h"
#include "engine/fsdp/fully_shard.h"

namespace fsdp::conformance {

// The seeds' axis {True, False, 2}.
ParamSpec ReshardAfterForwardAxis(const std::string& description = "fully_shard reshard_after_forward");
// "True" / "False" / an integer string; InvalidArgument naming the value otherwise.
fsdp2::ReshardAfterForward ParseReshardAfterForward(const std::string& value);
// A skip reason when the case's `reshard_after_forward` is an int that does not divide
// `world` (FSDP2 reshards to a sub-mesh of that size); nullopt otherwise.
std::optional<std::string> SkipIntNotAFactor(const CaseParams& params, int world);

}  // namespace fsdp::conformance
