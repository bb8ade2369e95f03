// Parallel styles of torch.distributed.tensor.parallel (style.py) for nn::Linear:
//
//   ColwiseParallel: weight Shard(0), bias Shard(0). The input (input_layouts, default
//     Replicate()) is redistributed to Replicate() (its gradient, a Partial sum of the local
//     products, is all-reduced in backward); the local output is Shard(-1), redistributed to
//     output_layouts (default Shard(-1)).
//   RowwiseParallel: weight Shard(1), bias Replicate(). The input (input_layouts, default
//     Shard(-1)) is redistributed to Shard(-1); the local output is Partial (the bias enters as
//     Replicate -> Partial, i.e. bias / W on every rank, as DTensor's addmm does), redistributed
//     to output_layouts: Replicate() (default, all_reduce) or Shard(d) (reduce_scatter).
//   SequenceParallel(sequence_dim=1): for the norm layers (nn::LayerNorm, RMSNormPython) that
//     run on activations sharded on the sequence dim: every parameter Replicate(); the input is
//     taken as this rank's Shard(sequence_dim) piece (from_local, no communication), so the
//     module computes on its rows only. Each parameter enters the call as
//     from_local(param, Replicate()).to_local(grad_placements=Partial()): its local gradient
//     sums over this rank's rows only, a Partial sum that from_local's backward all-reduces to
//     Replicate (one functional all_reduce per parameter per backward).
//
// The hooks compute with whatever the module's parameter slots hold at call time: the local
// shards, or, under fully_shard over the dp submesh (FSDP2 × TP), FSDP's unsharded TP-local
// tensors (engine/fsdp/tp_sharding.h).
// Applying a style to a module whose weight is already tensor-parallel fails.
// Parameters are sharded with distribute_tensor (src_data_rank 0) and registered with
// RegisterDTensorParameter: the module's slots hold the local shards. Plain tensor inputs are
// wrapped with DTensor.from_local(input_layouts) without communication. Outputs are returned
// as local tensors (use_local_output=True); DTensor outputs (use_local_output=False) need a
// module output type that carries DTensors, which nn::Value does not, and are rejected.
//
// Ownership: styles are immutable values shared by plans (std::shared_ptr); apply() installs
// hooks on the module that own copies of the style's options.
// Thread-safety: apply() and the hooks run on the module's rank thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/distributed/device_mesh.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::tensor_parallel {

// torch.distributed.tensor.parallel.ParallelStyle.
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // ParallelStyle._apply(module, device_mesh): shards `module`'s parameters over the 1-D
  // `device_mesh` and installs its input/output hooks. `fqn` names the module in errors.
  virtual void apply(nn::Module& module, const std::shared_ptr<distributed::DeviceMesh>& mesh,
                     const std::string& fqn) const = 0;
  // "ColwiseParallel(input_layouts=(Replicate(),), ...)".
  virtual std::string str() const = 0;
  // The placement apply() gives each parameter of the module, by attribute name ("weight",
  // "bias"); a parameter the module lacks is skipped by apply(). Default: none (a style that
  // shards no parameter).
  virtual std::vector<std::pair<std::string, Placement>> parameter_placements() const {
    return {};
  }
};

struct ParallelStyleOptions {
  std::optional<Placement> input_layouts;   // Default: the style's (see above)
  std::optional<Placement> output_layouts;  // Default: the style's (see above)
  bool use_local_output = true;             // Default: true (false is rejected)
};

class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(ParallelStyleOptions options = {});
  void apply(nn::Module& module, const std::shared_ptr<distributed::DeviceMesh>& mesh,
             const std::string& fqn) const override;
  std::string str() const override;
  std::vector<std::pair<std::string, Placement>> parameter_placements() const override;

 private:
  Placement input_layout_;
  Placement output_layout_;
};

class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(ParallelStyleOptions options = {});
  void apply(nn::Module& module, const std::shared_ptr<distributed::DeviceMesh>& mesh,
             const std::string& fqn) const override;
  std::string str() const override;
  std::vector<std::pair<std::string, Placement>> parameter_placements() const override;
  // The output's placement: Replicate() (all_reduce of the Partial output) or Shard(d)
  // (reduce_scatter onto dim d).
  const Placement& output_layouts() const { return output_layout_; }

 private:
  Placement input_layout_;
  Placement output_layout_;
};

// torch.distributed.tensor.parallel.SequenceParallel(sequence_dim=1, use_local_output=False).
// The output is the local tensor whatever use_local_output (module outputs cannot carry
// DTensors): its placement is Shard(sequence_dim), which the next style must be told
// (input_layouts=Shard(sequence_dim)), as PyTorch's sequence-parallel plans do.
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false);
  void apply(nn::Module& module, const std::shared_ptr<distributed::DeviceMesh>& mesh,
             const std::string& fqn) const override;
  std::string str() const override;
  std::vector<std::pair<std::string, Placement>> parameter_placements() const override;

 private:
  int64_t sequence_dim_;
  bool use_local_output_;
};

}  // namespace fsdp::tensor_parallel
