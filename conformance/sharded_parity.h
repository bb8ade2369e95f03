// Train parity of a fully sharded zoo model against the oracle, shared by the families that
// train under fully_shard (parity/fsdp/*, fully_shard_autograd/unused_forward_*,
// fully_shard_autograd/nontensor_activations).
//
// Each rank builds the zoo model with the case's weights, applies a ShardPlan with the case's
// fully_shard options (process group, reshard_after_forward), and trains `steps` steps on its
// slice of every global batch (TrainEngine: set_to_none alternating). Observations per rank:
// losses (its own loss per step), its SHARDED parameters after every step (tensors
// "step<k>/<fqn>", the local torch.chunk shard), its SHARDED gradients after every backward
// (tensors "grad<k>/<fqn>", before the optimizer step; an FQN whose .grad is None is absent;
// both along the case's shard_placement dim, ShardDimOf),
// and the full parameters after the last step (tensors "full/<fqn>", all-gathered). The judge
// runs the oracle's data-parallel training (reference/: per-rank losses, gradients averaged
// over ranks) and compares each rank's losses, each rank's parameter and gradient shards with
// the oracle's tensors chunked by the rank's own torch.chunk arithmetic (reference/sharding.h,
// `check_sharded_parity`), and the full parameters. Stateless; thread-safe.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/checks.h"
#include "conformance/model_zoo.h"
#include "conformance/params.h"
#include "conformance/parity_common.h"
#include "conformance/scenario.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

// Applies fully_shard to (parts of) `root` with `options`; children before the root.
using ShardPlan = std::function<void(const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options)>;

// The seeds' usual pattern: every element of a ModuleList child (the Transformer's blocks),
// every other direct child that owns parameters not shared with a sibling (MLP's
// in_proj/out_proj, DoubleLinear's lin1/lin2), then the root. Tied weights stay with the root.
void ShardChildrenThenRoot(const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options);
// The children that pattern shards before the root, in order.
std::vector<nn::ModulePtr> ChildrenToShard(const nn::ModulePtr& root);
// fully_shard on the submodules `fqns` in order (each must exist), then on the root.
ShardPlan ShardSubmodulesThenRoot(std::vector<std::string> fqns);
// fully_shard on every direct child (parameter-less ones included), then on the root: the
// seed's `for module in model: fully_shard(module)` over an nn.Sequential.
void ShardEveryChildThenRoot(const nn::ModulePtr& root, const fsdp2::FullyShardOptions& options);

// The rank's local parameter shards (named_parameters order), as an oracle map.
reference::RefTensorMap LocalParameterShards(nn::Module& module);
// The rank's local gradient shards; parameters whose .grad is None are absent.
reference::RefTensorMap LocalGradientShards(nn::Module& module);
// The full parameters (full_tensor(): an all-gather over the shard group for FSDP parameters,
// over dp and tp for tensor-parallel ones; others as held); every rank must call it
// (collectives).
reference::RefTensorMap FullShardedParameters(nn::Module& module);

// The uneven world a parity scenario of zoo model `kind` (parameters `params`) also runs by
// default: DiscriminatingWorld (conformance/uneven_world.h) over what is sharded at the default
// sizes, dim 0 of every parameter (FSDP2) or, with `flat_parameters`, the numel of each FSDP1
// flat parameter of ChildrenToShard's units and the root. 0 when no world up to max_world
// tells torch.chunk from a balanced split.
int ParityUnevenWorld(const ZooModelKind& kind, const std::vector<ParamSpec>& params, int max_world,
                      bool flat_parameters);

// The case's fully_shard options on this rank: its process group, its semantics profile (the
// default when the case has no `semantics` parameter), when the case has a
// `reshard_after_forward` parameter that value (None as nullopt), and its shard_placement_fn
// (ShardPlacementFnOf over the process group).
fsdp2::FullyShardOptions ShardOptionsOf(const RankEnv& env);

// The observations RunShardedParityRank reports (see above).
ObservationSchema ShardedParitySchema();
// One rank's run of zoo model `kind` under `plan` (observations as described above). The
// case needs the ParityParams of the kind plus a "dtype" parameter.
nlohmann::json RunShardedParityRank(const std::string& kind, const ShardPlan& plan, RankEnv& env);
// What each rank should report, from the oracle's data-parallel run: losses, "step{k}/{fqn}" and
// "grad{k}/{fqn}" shards (the rank's torch.chunk rows), "full/{fqn}" after the last step.
std::vector<nlohmann::json> ExpectShardedParity(const std::string& kind, const CaseParams& params,
                                                int world);
// For every step k of `expected` (ExpectShardedParity's layout), each gradient's largest
// expected magnitude over every rank's "grad{k}/" shard (the whole tensor's): the scale of its
// rounding, for CheckRankShardedParity.
std::vector<std::map<std::string, double>> GradientScales(
    const std::vector<nlohmann::json>& expected, int64_t steps);
// Rank `rank`'s losses, gradient and parameter shards at every step and full parameters after
// the last step against `expected` (ExpectShardedParity's layout: "grad{k}/", "step{k}/",
// "full/"), at the case's tolerance, a gradient's atol scaled by `grad_scales` (GradientScales
// of `expected`); the errors are merged into `param_err` / `grad_err`.
void CheckRankShardedParity(CheckList& checks, const ParityCase& c,
                            const std::vector<nlohmann::json>& expected,
                            const std::vector<std::map<std::string, double>>& grad_scales,
                            const std::vector<nlohmann::json>& per_rank, int rank,
                            ErrorStats& param_err, ErrorStats& grad_err);
// Judges every rank's observations against ExpectShardedParity; figures: steps, param/grad max errors.
void JudgeShardedParity(const std::string& kind, const CaseParams& params, int world,
                        const std::vector<nlohmann::json>& per_rank, CheckList& checks);

}  // namespace fsdp::conformance
