// Family `fully_shard_mixed_precision` (test_fully_shard_mixed_precision.py): MixedPrecisionPolicy
// as training plans (conformance/fully_shard_plan.h) on the zoo's MLPStack in float32, as the
// seed's nn.Sequential of three MLPs: fully_shard on blocks 0 and 1, then the root. Every
// case runs one optimizer step (grad_acc_with_reduce_dtype two); gradients, parameters and
// losses are judged against the float64 oracle within the bound derived from finfo(dtype).eps
// and the model's size (PlanMixedPrecisionRtol; the parameters' bound summed over the steps),
// and the collectives exactly: all-gathers carry param_dtype bytes,
// reduce-scatters reduce_dtype bytes (else param_dtype's, or the parameters' under torch-2.15),
// the gradients come back in the parameters' dtype, and the model's output has output_dtype
// (else param_dtype). Each scenario has a `semantics` parameter: with param_dtype set and
// reduce_dtype None, torch-2.4 and torch-2.8 reduce in param_dtype, torch-2.15 in the
// parameters' dtype (ProfileReducesInParamDtypeWhenReduceDtypeUnset); ctest and every default
// run also run each at world 2 under torch-2.15.
//   compute_dtype                TestFullyShardMixedPrecisionTraining.test_compute_dtype:
//                                param_dtype bfloat16 / float16
//   reduce_dtype                 TestFullyShardMixedPrecisionTraining.test_reduce_dtype:
//                                param_dtype float32 (or bfloat16) with reduce_dtype below or
//                                above it
//   grad_acc_with_reduce_dtype   TestFullyShardMixedPrecisionTraining
//                                .test_grad_acc_with_reduce_dtype: micro-batches without
//                                gradient sync, then a synced one, under param_dtype bfloat16
//                                and reduce_dtype float32, over two optimizer steps (as the
//                                seed's several iterations: the synced backward must leave no
//                                reduce_dtype accumulator behind for the next step's first
//                                backward); reshard_after_forward False also keeps the
//                                unsharded parameters (and their reduce_dtype accumulators)
//                                registered between micro-batches
//   output_dtype                 MixedPrecisionPolicy(output_dtype) on the root: the model's
//                                output cast
//   float16_on_one_submodule     TestFullyShardMixedPrecisionCasts
//                                .test_float16_on_one_submodule: per-module policies, blocks
//                                in low precision (cast_forward_inputs, output_dtype float32)
//                                under a full-precision root
//   low_precision_blocks_kwargs  the same shape on the Transformer, whose blocks are called as
//                                layer(x=h) (block_kwargs, default True): FSDP2 casts keyword
//                                inputs too (_apply_to_tensors over args and kwargs)
//   compute_dtype_token_ids      test_compute_dtype's policy on every fully_shard call of the
//                                Transformer: the root's int64 token ids are not cast
#include <optional>
#include <string>
#include <vector>

#include "conformance/fsdp_params.h"
#include "conformance/fully_shard_plan.h"
#include "conformance/scenario_registry.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kKind = "mlp_stack";
constexpr const char* kSeed =
    "test_fully_shard_mixed_precision.py::TestFullyShardMixedPrecisionTraining::";

// "None" or a dtype name.
std::optional<DType> OptionalDType(const CaseParams& p, const std::string& key) {
  const std::string value = p.GetString(key);
  if (value == "None") return std::nullopt;
  return ParseDType(value);
}

// One step of `micro_batches` backwards with the case's policy axes (those it declares).
FullyShardPlan MixedPrecisionPlan(const CaseParams& p) {
  FullyShardPlan plan = DecodePlanBase(kKind, p);
  plan.micro_batches = p.has("micro_batches") ? p.GetInt("micro_batches") : 1;
  if (p.has("param_dtype")) plan.mp_policy.param_dtype = OptionalDType(p, "param_dtype");
  if (p.has("reduce_dtype")) plan.mp_policy.reduce_dtype = OptionalDType(p, "reduce_dtype");
  // output_dtype on the root only: a block casting its output to another dtype would feed the
  // next block's Linear an input of another dtype than its weight (F.linear raises).
  if (p.has("output_dtype")) {
    fsdp2::MixedPrecisionPolicy root = plan.mp_policy;
    root.output_dtype = OptionalDType(p, "output_dtype");
    plan.group_mp_policies[""] = root;
  }
  return plan;
}

// What every scenario of the family shares: `steps` defaults to `default_steps` (one optimizer
// step but for gradient accumulation); the reduce dtype depends on the semantics profile (a
// `semantics` parameter, and a ctest run under torch-2.15, whose rule differs).
void FinishMixedPrecision(Scenario& s, int64_t default_steps = 1) {
  s.info.params = OverrideParam(std::move(s.info.params),
                                ParamSpec::SizeInt("steps", "optimizer steps", default_steps, 1));
  s.info.params.push_back(SemanticsParam());
  s.info.test_runs.push_back(
      {2, {{kSemanticsParam, fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_15)}}});
  // In a default run too: only torch-2.15 upcasts the gradients computed in param_dtype to the
  // parameters' dtype when reduce_dtype is unset, a rule no other profile exercises.
  s.info.extra_default_runs.push_back(
      {2, {{kSemanticsParam, fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_15)}}});
}

Scenario Make(const std::string& test, const std::string& description,
              std::vector<ParamSpec> axes, bool accumulate) {
  Scenario s = MakePlanScenario(
      "fully_shard_mixed_precision/" + test, description,
      test == "output_dtype" ? "MixedPrecisionPolicy(output_dtype) (no seed test)"
                             : std::string(kSeed) + "test_" + test,
      kKind, "float32", std::move(axes), [accumulate](const CaseParams& p, int) {
        FullyShardPlan plan = MixedPrecisionPlan(p);
        plan.accumulate_without_sync = accumulate;
        if (p.has("reshard_after_forward")) {
          plan.reshard_after_forward = p.GetBool("reshard_after_forward");
        }
        // As the seed: set_reshard_after_backward(is_last_microbatch or reshard_after_forward)
        // beside set_requires_gradient_sync(is_last_microbatch), so without resharding after
        // forward the unsharded parameters stay registered between the micro-batches.
        plan.no_reshard_after_backward = accumulate && !plan.reshard_after_forward;
        return plan;
      });
  // Accumulation over two steps: the second step's first backward shows what the first
  // step's synced backward left behind.
  FinishMixedPrecision(s, accumulate ? 2 : 1);
  return s;
}

// test_float16_on_one_submodule's shape: the root keeps full precision while the `groups`
// compute in `param_dtype` with MixedPrecisionPolicy(param_dtype, output_dtype=the parameters'
// dtype, cast_forward_inputs=True): each block casts its full-precision input down and its
// output back up. On MLPStack the groups are blocks 0 and 1 (block 2 is the root's); on the
// Transformer every block, whose input is the keyword argument x when `block_kwargs` (FSDP2
// casts keyword tensors as positional ones: a block left with a float32 input would feed its
// Linear an input of another dtype than its weight).
Scenario LowPrecisionSubmodules(const std::string& name, const std::string& kind,
                                const std::string& description) {
  Scenario s = MakePlanScenario(
      "fully_shard_mixed_precision/" + name, description,
      "test_fully_shard_mixed_precision.py::TestFullyShardMixedPrecisionCasts::"
      "test_float16_on_one_submodule",
      kind, "float32",
      {ParamSpec::Axis("param_dtype", "the blocks' MixedPrecisionPolicy.param_dtype",
                       {"float16", "bfloat16"})},
      [kind](const CaseParams& p, int) {
        FullyShardPlan plan = DecodePlanBase(kind, p);
        if (kind == "transformer") {
          plan.groups.clear();
          for (int64_t i = 0; i < p.GetInt("n_layers"); ++i) {
            plan.groups.push_back("layers." + std::to_string(i));
          }
        }
        fsdp2::MixedPrecisionPolicy low;
        low.param_dtype = ParseDType(p.GetString("param_dtype"));
        low.output_dtype = plan.dtype;
        low.cast_forward_inputs = true;
        for (const std::string& fqn : plan.groups) plan.group_mp_policies[fqn] = low;
        return plan;
      });
  FinishMixedPrecision(s);
  return s;
}

// test_compute_dtype's policy on the Transformer (every block, then the root), whose root takes
// int64 token ids: FSDP2's forward-input cast (_cast_fp_tensor) casts floating-point tensors
// only, so the ids reach the embeddings as they are while every group computes in param_dtype.
Scenario ComputeDtypeTokenIds() {
  Scenario s = MakePlanScenario(
      "fully_shard_mixed_precision/compute_dtype_token_ids",
      "Transformer (int64 token ids) with param_dtype bfloat16 on every fully_shard call, "
      "cast_forward_inputs: the ids left uncast, every group's collectives in its dtype, values "
      "vs the oracle",
      std::string(kSeed) + "test_compute_dtype", "transformer", "float32",
      {ParamSpec::SizeString("param_dtype", "MixedPrecisionPolicy.param_dtype", "bfloat16")},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = DecodePlanBase("transformer", p);
        plan.groups.clear();
        for (int64_t i = 0; i < p.GetInt("n_layers"); ++i) {
          plan.groups.push_back("layers." + std::to_string(i));
        }
        plan.mp_policy.param_dtype = ParseDType(p.GetString("param_dtype"));
        return plan;
      });
  s.info.params =
      OverrideParam(std::move(s.info.params), ParamSpec::SizeInt("steps", "optimizer steps", 1, 1));
  s.info.params.push_back(SemanticsParam());
  // ctest under torch-2.15 too; no extra default run (the profiles' reduce rules are the other
  // scenarios' point, the input cast is the same under every profile).
  s.info.test_runs.push_back(
      {2, {{kSemanticsParam, fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_15)}}});
  return s;
}

}  // namespace

void RegisterFullyShardMixedPrecisionScenarios(ScenarioRegistry& registry) {
  Scenario compute_dtype = Make(
      "compute_dtype",
      "MLPStack with param_dtype bfloat16 / float16: all-gathers and compute in "
      "param_dtype, reduce-scatter in it (torch-2.15: in float32), float32 "
      "gradients; vs the oracle within u * sqrt(N)",
      {ParamSpec::Axis("param_dtype", "MixedPrecisionPolicy.param_dtype", {"bfloat16", "float16"})},
      /*accumulate=*/false);
  // torch-2.8 still reduces in param_dtype when reduce_dtype is unset (only torch-2.15
  // upcasts): one default run under that profile, so that an implementation taking 2.8 for
  // 2.15 (or the reverse) fails on the reduce-scatter bytes and the gradient rounding.
  compute_dtype.info.extra_default_runs.push_back(
      {2,
       {{kSemanticsParam, fsdp2::SemanticsName(fsdp2::Semantics::kTorch2_8)},
        {"param_dtype", "bfloat16"}}});
  registry.Add(std::move(compute_dtype));
  registry.Add(Make("reduce_dtype",
                    "MLPStack with reduce_dtype bfloat16 under param_dtype float32, or float32 "
                    "under param_dtype bfloat16: the reduce-scatter's dtype and bytes, gradients "
                    "cast back to float32, values vs the oracle",
                    {ParamSpec::Axis("param_dtype", "MixedPrecisionPolicy.param_dtype",
                                     {"float32", "bfloat16"}),
                     ParamSpec::Axis("reduce_dtype", "MixedPrecisionPolicy.reduce_dtype",
                                     {"bfloat16", "float32"})},
                    /*accumulate=*/false));
  registry.Add(
      Make("grad_acc_with_reduce_dtype",
           "MLPStack with param_dtype bfloat16, reduce_dtype float32: micro-batches "
           "without gradient sync, then a synced one; counts, bytes and values",
           {ParamSpec::SizeString("param_dtype", "MixedPrecisionPolicy.param_dtype", "bfloat16"),
            ParamSpec::SizeString("reduce_dtype", "MixedPrecisionPolicy.reduce_dtype", "float32"),
            ParamSpec::SizeInt("micro_batches", "backwards in the step", 3, 1),
            ParamSpec::Axis("reshard_after_forward",
                            "every fully_shard call's reshard_after_forward; False "
                            "also keeps the parameters unsharded after the backwards "
                            "without sync (set_reshard_after_backward(False))",
                            {"True", "False"})},
           /*accumulate=*/true));
  registry.Add(Make("output_dtype",
                    "MLPStack with param_dtype bfloat16, the root's output_dtype float32 / "
                    "float16: the model's output dtype, gradients vs the oracle",
                    {ParamSpec::SizeString("param_dtype", "MixedPrecisionPolicy.param_dtype",
                                           "bfloat16"),
                     ParamSpec::Axis("output_dtype", "MixedPrecisionPolicy.output_dtype",
                                     {"float32", "float16"})},
                    /*accumulate=*/false));
  registry.Add(LowPrecisionSubmodules(
      "float16_on_one_submodule", kKind,
      "MLPStack in float32, blocks 0 and 1 with param_dtype float16 / bfloat16, "
      "cast_forward_inputs and output_dtype float32, the root without mixed precision: each "
      "block's collectives in its own dtype (torch-2.15: reduce-scatters in float32), values "
      "vs the oracle"));
  Scenario blocks = LowPrecisionSubmodules(
      "low_precision_blocks_kwargs", "transformer",
      "Transformer in float32 calling each block as layer(x=h), every block with param_dtype "
      "float16 / bfloat16, cast_forward_inputs and output_dtype float32 under a "
      "full-precision root: the keyword input cast like a positional one, each block's "
      "collectives in its own dtype, values vs the oracle");
  for (ParamSpec& spec : blocks.info.params) {
    if (spec.name == "block_kwargs") {
      spec = ParamSpec::SizeBool("block_kwargs", spec.description, true);
    }
  }
  registry.Add(std::move(blocks));
  registry.Add(ComputeDtypeTokenIds());
}

}  // namespace fsdp::conformance
