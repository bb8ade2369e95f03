// The FSDP1 families' wrapping of a zoo model and the layout of the flat parameters it makes:
// WrapChildrenThenRoot nests a FullyShardedDataParallel instance around each of ChildrenToShard's
// units (conformance/sharded_parity.h) under the root's; Fsdp1FlatParamFqns names the original
// parameters of each resulting flat parameter, and LayOutFlatParam applies PyTorch's layout rule
// (_flat_param.py: _init_flat_param_and_metadata pads each parameter's start to 16 bytes of the
// compute dtype and the total to a multiple of the shard group's size; FlatParamHandle.shard
// gives shard-group rank r the r-th equal chunk). The layouts are computed from the oracle's
// parameter shapes, never read from the engine. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conformance/model_zoo.h"
#include "engine/core/dtype.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

// FullyShardedDataParallel(module, options) with options.auto_wrap_policy replaced by a
// LambdaAutoWrapPolicy that picks exactly ChildrenToShard(module) (the Transformer's blocks,
// MLP's in_proj/out_proj, DoubleLinear's lin1/lin2). With `first_child_strategy`, the children
// are wrapped by hand instead (auto wrapping refuses modules already wrapped), the first with
// that sharding strategy, the others and the root with options' (test_fsdp_clip_grad_norm.py's
// "mixed_strategy").
std::shared_ptr<fsdp1::FullyShardedDataParallel> WrapChildrenThenRoot(
    const nn::ModulePtr& module, fsdp1::FullyShardedDataParallelOptions options,
    std::optional<fsdp1::ShardingStrategy> first_child_strategy = std::nullopt);

// One flat parameter WrapChildrenThenRoot makes: its original parameters by FQN, in flat order.
struct Fsdp1FlatParamFqns {
  std::vector<std::string> fqns;
  bool root = false;  // the root instance's (which never frees its parameters after forward)
};
// The flat parameters WrapChildrenThenRoot makes of `model`: one per ChildrenToShard unit that
// has parameters, then the root's (every parameter no unit holds; a tied parameter once, under
// its first FQN) when there are any.
std::vector<Fsdp1FlatParamFqns> Fsdp1FlatParamsOf(const ZooModel& model);

// Where the original parameters lie in one padded flat parameter sharded over `shard_world`
// ranks.
struct FlatParamLayout {
  std::vector<std::string> fqns;  // in flat order
  std::vector<int64_t> offsets;   // each parameter's first element in the padded flat parameter
  std::vector<int64_t> numels;    // each parameter's numel
  int64_t padded_numel = 0;       // the total, padded to a multiple of shard_world
  int64_t shard_numel = 0;        // padded_numel / shard_world: rank r holds [r * it, (r + 1) * it)

  // The elements of parameter i that shard-group rank `rank` holds: [begin, end) within the
  // parameter, empty (begin == end) when none.
  std::pair<int64_t, int64_t> ParamRangeOnRank(size_t i, int64_t rank) const;
};
// The layout of the flat parameter of `fqns` (parameters of `model`) whose forward and backward
// compute in `compute_dtype`, over a shard group of `shard_world` ranks (1: unsharded).
FlatParamLayout LayOutFlatParam(const ZooModel& model, const std::vector<std::string>& fqns,
                                DType compute_dtype, int64_t shard_world);

}  // namespace fsdp::conformance
