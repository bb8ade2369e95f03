// A training plan under FSDP2's policies and runtime switches, judged against the oracle: the
// shared body, expectations and judge of the families that exercise fully_shard's API beyond
// the seeds (fully_shard_training/*, fully_shard_mixed_precision/*).
//
// A plan trains zoo model `kind` (runner-owned weights and inputs, ZooModel::MakeCaseInputs)
// for `steps` optimizer steps of `micro_batches` micro-batches each (micro-batch i of step k is
// zoo step j = k * micro_batches + i), plain SGD after the last micro-batch of a step, then
// zero_grad(set_to_none=True). Each rank applies fully_shard to the submodules `groups`, then to
// the root, with the plan's policies (process group or HSDP's 2-D (replicate, shard) mesh,
// MixedPrecisionPolicy, OffloadPolicy, ignored_params), then per micro-batch applies the plan's
// switches (set_requires_gradient_sync / set_reshard_after_backward / set_is_last_backward, as
// test_fully_shard_training.py's test_gradient_accumulation does: off for every micro-batch but
// the last of a step) and set_gradient_divide_factor once.
//
// Observations per rank: every micro-batch's loss, its collective counts and payload bytes per
// phase (CommDebugMode), the reduce ops of its backward's reduce-scatters and all-reduces, the
// dtype of the model's output, the Linear modules fed an input of another dtype than their weight
// (PyTorch's F.linear raises there); after the last backward of each step the local gradient shards
// ("grad{k}/{fqn}") and the device they live on; after each optimizer step the local parameter
// shards ("step{k}/{fqn}"); after the last step the full parameters
// ("full/{fqn}", all-gathered; ignored parameters as the rank holds them).
//
// The oracle (reference/) runs every rank's forward and backward in float64 from the same
// weights and inputs and applies the FSDP2 reduction rules, which hold for any size: a managed
// parameter's gradient is the sum over the ranks of the data-parallel group divided by the
// divide factor (the world size unless set_gradient_divide_factor set one), accumulated over
// the micro-batches of a step whether a group reduced each of them or only the last (the
// unsharded gradient accumulates locally until the synced backward); an ignored parameter keeps
// the rank's own gradient and is stepped locally, so ranks diverge. The expected shards are the
// rank's torch.chunk rows over the shard group (HSDP: the rank's coordinate on the shard
// dimension of the row-major mesh). Collective counts follow docs/fsdp-behaviour.md
// ("Collective counts"), derived per group from the switches and the group's
// MixedPrecisionPolicy; their reduce ops follow "Gradient divide factors" (PyTorch's
// _get_gradient_divide_factors: AVG for a float32 or bfloat16 reduction, SUM with a divide
// otherwise or under force_sum_reduction, PREMUL_SUM for a divide factor). The ranks run on the
// CPU, where every gradient lives, CPU offload or not (the offload's host copies are judged by
// values). Mixed precision is judged within a bound derived from finfo(dtype).eps and the model
// (PlanMixedPrecisionRtol).
//
// Stateless; thread-safe (run_rank runs on every rank's thread with its own module).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/checks.h"
#include "conformance/fsdp1_params.h"
#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/core/dtype.h"
#include "engine/fsdp/fsdp_api.h"
#include "engine/fsdp/semantics.h"

namespace fsdp::conformance {

// What a plan does; decoded from a case by each family (PlanDecoder). A value type.
struct FullyShardPlan {
  std::string kind = "mlp_stack";  // Default: the zoo's MLPStack (three MLP blocks)
  // The fully_shard calls before the root's, in order: each a submodule FQN, or several joined
  // by ", " for one call over all of them, fully_shard([m1, m2]) (the group's module FQN as
  // PyTorch names it). Default: "0", "1" (the root manages the third block, so the root group
  // has parameters too).
  std::vector<std::string> groups = {"0", "1"};
  // Every fully_shard call's reshard_after_forward (the root is kept unsharded after forward
  // whatever the value, as lazy init does). Default: true.
  bool reshard_after_forward = true;
  // Calls of a group's module in one forward, by FQN (a module used twice: 2). Default: one
  // call each. A non-root group reshards after each call, so each further call all-gathers.
  std::map<std::string, int64_t> forward_calls;
  // `groups` entries whose module gets set_unshard_in_backward(False) (its backward needs no
  // parameters, an embedding's): a group resharded after forward is not all-gathered in
  // backward. Default: none.
  std::set<std::string> no_unshard_in_backward;
  uint64_t seed = 0;
  DType dtype = DType::kFloat64;  // the parameters' (and inputs') dtype
  int64_t steps = 2;              // optimizer steps (>= 1)
  int64_t micro_batches = 1;      // backwards per optimizer step (>= 1)
  double lr = 1e-2;               // plain SGD (no momentum)
  // Gradient accumulation as test_gradient_accumulation: every micro-batch but the last of a
  // step runs with set_requires_gradient_sync(False, recurse) and set_is_last_backward(False),
  // called on the root. Default: off (every backward syncs).
  bool accumulate_without_sync = false;
  bool recurse = true;  // the switches' recurse argument
  // Every micro-batch but the last of a step runs with set_reshard_after_backward(False,
  // recurse), with or without accumulate_without_sync (without it: the unsharded parameters
  // kept between backwards that each reduce). Default: off.
  bool no_reshard_after_backward = false;
  // set_gradient_divide_factor(factor) on every FSDP module. Default: unset (the world size).
  std::optional<double> divide_factor;
  // divide_factor: set_gradient_divide_factor on the root only. FSDPModule's setter is not
  // recursive (it sets the module's own group), so the other groups keep the data-parallel
  // size. Default: off (every FSDP module).
  bool divide_factor_root_only = false;
  bool hsdp = false;  // the 2-D (replicate, shard) mesh of HsdpMeshShape(world)
  // HSDP's shard size: > 0 the (world / it, it) mesh (1: every rank its own shard group, as the
  // seed's (2, 1) mesh at world 2); 0: HybridMeshShapeFor(world), both dims >= 2.
  int hsdp_shard_size = 0;
  // set_force_sum_reduction_for_comms(True) on every FSDP module: SUM collectives and a
  // post-divide instead of AVG. Default: off.
  bool force_sum_reduction = false;
  // HSDP: every micro-batch but the last of a step runs with set_requires_all_reduce(False)
  // (on the root, recurse): it reduce-scatters and keeps the partial sums, the last one adds
  // them and all-reduces. Default: off (every backward all-reduces).
  bool defer_all_reduce = false;
  // defer_all_reduce: the last micro-batch turns the all-reduce back on with
  // set_requires_gradient_sync(True) (which sets both switches) instead of
  // set_requires_all_reduce(True). Default: off.
  bool resume_all_reduce_with_gradient_sync = false;
  // The switches of accumulate_without_sync and defer_all_reduce called only where their value
  // changes (before the first and the last micro-batch of a step) instead of before every
  // micro-batch as the tests do: FSDPModule's switches hold until set again, so the micro-batches
  // between run with the first one's. Default: off.
  bool switches_on_change = false;
  // Every fully_shard call's semantics profile: the case's `semantics` (the default profile
  // for a family without that parameter). It decides the reduce dtype of a group with
  // param_dtype and no reduce_dtype (ProfileReducesInParamDtypeWhenReduceDtypeUnset).
  fsdp2::Semantics semantics = fsdp2::kDefaultSemantics;
  fsdp2::MixedPrecisionPolicy mp_policy;  // every fully_shard call's, unless overridden below
  // A group's own MixedPrecisionPolicy by module FQN ("" the root). Default: none.
  std::map<std::string, fsdp2::MixedPrecisionPolicy> group_mp_policies;
  fsdp2::OffloadPolicy offload_policy;
  std::vector<std::string> ignored_params;  // FQNs passed as ignored_params to every call
  // Frozen parameters (test_fully_shard_frozen.py): requires_grad_(False) on these FQNs before
  // fully_shard, or on the sharded parameters after it when `freeze_after_init`; from step
  // `unfreeze_at_step` on they train again (requires_grad_(True) before its first forward).
  // A frozen parameter gets no gradient, is not reduced and is not stepped. `groups` must list
  // the modules in forward order when some are frozen: a group whose outputs require no
  // gradient (no trainable parameter in it or before it) has no pre-backward, and only the
  // next group's implicit prefetch all-gathers it in backward. Default: none.
  std::vector<std::string> frozen_params;
  bool freeze_after_init = false;
  std::optional<int64_t> unfreeze_at_step;
  Tolerance tolerance;                      // for values without mixed precision
  // For the losses: `tolerance`, or the float32 one when the model's output is float32 whatever
  // the parameters' dtype (ZooModelKind::float32_output, the Transformer).
  Tolerance loss_tolerance;

  // The (replicate, shard) mesh of HSDP at `world` ranks (hsdp_shard_size); nullopt where the
  // world has none.
  std::optional<HybridMeshShape> HsdpMeshShape(int world) const;
  // The ranks one reduce-scatter spans: the shard dimension of the HSDP mesh, else the world.
  int ShardSize(int world) const;
  // This rank's index within its shard group.
  int ShardRank(int rank, int world) const;
  // The divide factor set on the group of module `fqn` ("" the root), nullopt where unset.
  std::optional<double> DivideFactorOf(const std::string& fqn) const;
  // The policy of the group of module `fqn` ("" the root).
  const fsdp2::MixedPrecisionPolicy& PolicyOf(const std::string& fqn) const;
  // Some group's param_dtype or reduce_dtype differs from / is below the parameters' dtype.
  bool UsesMixedPrecision() const;
  // Whether parameter `fqn` requires a gradient during optimizer step k.
  bool Trains(const std::string& fqn, int64_t k) const;
};

// The module FQNs of one `groups` entry ("layers.1, layers.2" -> {"layers.1", "layers.2"}).
std::vector<std::string> GroupModules(const std::string& group);

// A family's decoding of a case at a world size into its plan.
using PlanDecoder = std::function<FullyShardPlan(const CaseParams& params, int world)>;

// The parameters every plan family declares: seed, steps, lr, dtype and the tolerances
// (atol/rtol for float32 runs, atol_float64/rtol_float64 for float64 ones), plus zoo model
// `kind`'s own knobs.
std::vector<ParamSpec> PlanParams(const std::string& kind, const std::string& default_dtype);
// A plan with those parameters decoded, and the case's semantics profile (SemanticsOf; the
// family fills in the rest).
FullyShardPlan DecodePlanBase(const std::string& kind, const CaseParams& params);

// The runner-owned inputs: the zoo's weights and, per rank, the input of every micro-batch
// (StepInputName(j), j = k * micro_batches + i).
InputsFn PlanInputs(const PlanDecoder& decode);
InputsDoc PlanInputsDoc(const std::string& kind);

// The observation schema described in the file comment.
ObservationSchema PlanSchema();
// One rank's run of the plan (observations as described in the file comment).
nlohmann::json RunPlanRank(const FullyShardPlan& plan, RankEnv& env);
// What every rank reports, by the oracle and the rules above.
std::vector<nlohmann::json> ExpectPlan(const FullyShardPlan& plan, const CaseParams& params,
                                       int world);
// Judges every rank against ExpectPlan (mixed precision within the derived bound).
void JudgePlan(const FullyShardPlan& plan, const CaseParams& params, int world,
               const std::vector<nlohmann::json>& per_rank, CheckList& checks);

// The relative error mixed precision adds to a gradient the oracle computes in double: with
// param_dtype of unit roundoff u = finfo(param_dtype).eps / 2 every parameter and activation is
// rounded and every operation forward and backward rounds again, errors that accumulate like a
// random walk over the model's N parameters, u * sqrt(N); a reduce_dtype below the gradient's
// adds u_r * (1 + ceil(log2(W))) (the cast, then one rounding per stage of the reduction tree).
// With per-group policies the coarsest group's terms apply. 0 without mixed precision.
// The bound holds at the oracle's parameters; over several optimizer steps the engine's
// parameters drift from the oracle's by lr times the earlier steps' gradient bounds (JudgePlan
// sums them for the parameters), a move whose effect on the next gradient is lr times smaller
// than the bound itself.
double PlanMixedPrecisionRtol(const FullyShardPlan& plan, const CaseParams& params, int world);

// Builds a Scenario of a plan family: name, description, seed test, parameters (PlanParams plus
// `extra_params`), inputs, schema, body, expect and judge, all from `decode`. Worlds 1-8
// (default 2); HSDP plans skip worlds without a (replicate, shard) mesh.
Scenario MakePlanScenario(const std::string& name, const std::string& description,
                          const std::string& seed_test, const std::string& kind,
                          const std::string& default_dtype, std::vector<ParamSpec> extra_params,
                          PlanDecoder decode);

}  // namespace fsdp::conformance
