// The `_init_transformer`-style model of the FSDP2 scenario families (fully_shard_comm,
// fully_shard_overlap): common_dtensor.py's Transformer(ModelArgs(n_layers)) loaded with the
// case's runner-owned weights (transformer_inputs.h), every TransformerBlock sharded with
// fully_shard, then the root. Stateless; thread-safe (each call builds its rank's own model).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "conformance/scenario.h"
#include "engine/distributed/device_mesh.h"
#include "engine/core/tensor.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/nn/models.h"

namespace fsdp::conformance {

// The case's `n_layers` blocks, on the rank's device, sharded over the world group (or over
// `mesh` when given: a 2-D (replicate, shard) mesh is HSDP) with the case's semantics profile
// and `raf` (nullopt: None). checkpoint_impl: "none", "utils" (per-block checkpoint inside the
// Transformer) or "composable" (nn::checkpoint on each block before fully_shard).
std::shared_ptr<nn::Transformer> ShardedTransformer(
    const RankEnv& env, std::optional<fsdp2::ReshardAfterForward> raf,
    const std::string& checkpoint_impl = "none",
    std::shared_ptr<distributed::DeviceMesh> mesh = nullptr);

// The rank's token batch (the runner-owned input StepInputName(0)) on the rank's device.
Tensor TransformerTokens(const RankEnv& env);

}  // namespace fsdp::conformance
