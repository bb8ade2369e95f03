// The fully_shard knobs that FSDP scenario families share as parameters, and the rules their
// judges derive expectations from:
//
//   semantics              the FSDP semantics profile the case is judged by (a fixed value, not
//                          an axis; default torch-2.4): which PyTorch release's rules apply
//                          where FSDP2 changed (docs/scenarios.md, "Semantics profiles";
//                          engine/fsdp/semantics.h). `fsdp-conform run --semantics` sets it.
//   reshard_after_forward  an axis running the seed's values {True, False, 2} that accepts
//                          every valid value when fixed: True, False, None (torch-2.8 and
//                          later) or an int >= 1 (one that does not divide the world size
//                          skips the case).
//   shard_placement        a fixed value, dim0 (default) or largest_dim: fully_shard's
//                          shard_placement_fn, none (every parameter Shard(0)) or every
//                          parameter on its largest dim that shards evenly
//                          (fsdp2::LargestEvenShardDim; dim 0 when none does), so no case
//                          skips; a dim after 0 is returned from the end (Shard(dim - ndim)),
//                          which fully_shard normalizes.
//
// Stateless; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/semantics.h"

namespace fsdp::conformance {

inline constexpr const char* kSemanticsParam = "semantics";

// The `semantics` parameter: a size (fixed value) whose domain is the known profiles, default
// torch-2.4.
ParamSpec SemanticsParam();
// The case's profile; the default profile when the scenario has no `semantics` parameter.
fsdp2::Semantics SemanticsOf(const CaseParams& params);

inline constexpr const char* kShardPlacementParam = "shard_placement";

// The `shard_placement` parameter (see the file comment).
ParamSpec ShardPlacementParam();
// The case's shard dim for a parameter of `shape` sharded over `shard_world` ranks: 0, or
// with largest_dim fsdp2::LargestEvenShardDim (0 when the case has no `shard_placement`).
int64_t ShardDimOf(const CaseParams& params, const Shape& shape, int shard_world);
// The case's shard_placement_fn over `shard_world` ranks (null for dim0 or no parameter).
fsdp2::ShardPlacementFn ShardPlacementFnOf(const CaseParams& params, int shard_world);

// The seed's axis {True, False, 2}; --param also takes None and any int >= 1.
ParamSpec ReshardAfterForwardAxis(const std::string& description = "fully_shard reshard_after_forward");
// "True" / "False" / "None" / an integer string as the fully_shard option (nullopt is None).
// InvalidArgument naming the value for anything else, and for None under a profile without
// None (torch-2.4, whose fully_shard takes a bool or an int).
std::optional<fsdp2::ReshardAfterForward> ParseReshardAfterForward(const std::string& value,
                                                                   fsdp2::Semantics semantics);
// The case's `reshard_after_forward` under the case's profile, as ParseReshardAfterForward.
std::optional<fsdp2::ReshardAfterForward> ReshardAfterForwardOf(const CaseParams& params);
// For Scenario::skip: a skip reason when the case's `reshard_after_forward` is an int that does
// not divide `world` (FSDP2 reshards to a sub-mesh of that size); nullopt otherwise. Throws
// InvalidArgument for a value the case's profile rejects (None under torch-2.4), so that the
// runner's plan fails before anything runs.
std::optional<std::string> SkipIntNotAFactor(const CaseParams& params, int world);

// The axes fixing the later semantics profile (torch-2.8), e.g. for ctest's test_runs.
std::map<std::string, std::string> LaterProfile();

// The runs under the later profile of a scenario whose expectations depend on it (its extra
// default runs, or ctest's test_runs at another world): at `world`, with `fixed` and
// semantics=torch-2.8, once as given and once with reshard_after_forward=None.
std::vector<TestRun> LaterProfileRuns(int world, std::map<std::string, std::string> fixed = {});

// The judges' own statements of the rules where the profiles differ (docs/scenarios.md,
// "Semantics profiles"), written from each release's PyTorch source and deliberately not
// calling engine/fsdp/semantics.h: an engine whose profile rule is wrong must fail the judge,
// not move the expectation with it.
//
// Whether fully_shard accepts reshard_after_forward=None: torch-2.8 and later (torch-2.4's
// fully_shard takes a bool or an int).
bool ProfileAcceptsReshardAfterForwardNone(fsdp2::Semantics semantics);
// Whether the end-of-backward callback (`FSDPState._root_post_backward_final_callback`) gives
// post_backward() to every group not yet in POST_BACKWARD (torch-2.8 and later) rather than
// only to the groups still unsharded (torch-2.4).
bool ProfileSweepsEveryGroupAtEndOfBackward(fsdp2::Semantics semantics);
// Whether a MixedPrecisionPolicy with param_dtype and no reduce_dtype reduces (and accumulates)
// the gradients in param_dtype (torch-2.4, torch-2.8) rather than in the parameters' original
// dtype (torch-2.15, `FSDPParam.init_dtype_attrs`).
bool ProfileReducesInParamDtypeWhenReduceDtypeUnset(fsdp2::Semantics semantics);
// Whether a gradient accumulated without reduction stays in the unsharded parameter's .grad,
// in the reduce dtype (torch-2.15: `_unsharded_param.grad_dtype = unsharded_grad_dtype`)
// rather than moving into `unsharded_accumulated_grad` when the reduce dtype differs from
// the gradient's, .grad left None (torch-2.4, torch-2.8: `to_accumulated_grad_if_needed`).
// One change with the reduce dtype's (2.15's `unsharded_grad_dtype`): the negation of
// ProfileReducesInParamDtypeWhenReduceDtypeUnset.
bool ProfileKeepsUnshardedGradInReduceDtype(fsdp2::Semantics semantics);
// Whether lazy init checks that every parameter of a group, frozen ones included, has one
// original dtype (torch-2.4: `FSDPParamGroup._init_mp_dtypes` over all of `fsdp_params`)
// rather than only the parameters that require grad (torch-2.8 and later).
bool ProfileChecksFrozenParamDtypes(fsdp2::Semantics semantics);

// The judges' rule (docs/fsdp-behaviour.md, "Semantics profiles"): whether a module that
// fully_shard was applied to with the case's `reshard_after_forward` reshards its parameters
// after forward (so that backward all-gathers them again), given whether it is the root of
// lazy init. Non-root: True, an int > 1 and None do; False and the int 1 do not. The root:
// never under torch-2.4; under torch-2.8 as a non-root module except for None.
bool ReshardsAfterForward(const CaseParams& params, bool is_root);

// How FSDP2 divides the reduced gradients, recomputed for a judge from PyTorch's
// _get_gradient_divide_factors (docs/fsdp-behaviour.md, "Gradient divide factors"): the
// reduce-scatter's op over `shard_size` ranks, the HSDP all-reduce's op across
// `replicate_size` replicas, and the pre/post divides. A float32 or bfloat16 reduction without
// force_sum averages (SUM over one rank), or with a divide factor uses PREMUL_SUM (AVG when the
// factor is the shard size) and sums across the replicas; any other reduce dtype, or
// force_sum, sums both and divides by the factor (default: the data-parallel size), split into
// a pre- and a post-divide for those other dtypes (the pre-divide doubles while it divides the
// factor and the factor over it exceeds it).
struct ExpectedDivideFactors {
  std::string reduce_scatter_op = "AVG";
  std::string all_reduce_op = "AVG";
  double pre = 1.0;
  double post = 1.0;
};
ExpectedDivideFactors ExpectedGradientDivideFactors(DType reduce_dtype, int shard_size,
                                                    int replicate_size,
                                                    std::optional<double> factor, bool force_sum);

}  // namespace fsdp::conformance
