// Family `fully_shard_training` (test_fully_shard_training.py, FSDP2's training tests) and
// `fully_shard_comm/set_reduce_scatter_divide_factor`: FSDP2's policies and runtime switches
// beyond the seeds, each a training plan (conformance/fully_shard_plan.h), most on the zoo's
// MLPStack (fully_shard on blocks 0 and 1, then the root, which manages block 2), judged against
// the oracle's per-rank gradients reduced by FSDP2's rules, and against collective counts and
// payload bytes derived from the switches:
//   gradient_accumulation        TestFullyShardGradientAccumulation.test_gradient_accumulation:
//                                micro-batches with set_requires_gradient_sync(False, recurse),
//                                optionally set_reshard_after_backward(False, recurse), and
//                                set_is_last_backward(False) but the last of a step (before
//                                every micro-batch, or only where a value changes); mode "sync"
//                                reduces in every backward (several backwards before one step),
//                                with reshard_after_backward=False keeping the unsharded
//                                parameters between those backwards (no all-gather in the
//                                next forward)
//   train_parity_hsdp            TestFullyShardHSDPTraining.test_train_parity_hsdp: the 2-D
//                                (replicate, shard) mesh, reduce-scatter then all-reduce;
//                                optionally set_requires_all_reduce(False) but for the last
//                                micro-batch of a step (partial sums kept, then all-reduced),
//                                set_gradient_divide_factor and
//                                set_force_sum_reduction_for_comms (extra default runs)
//   train_parity_cpu_offload     TestFullyShard1DTrainingCore
//                                .test_train_parity_multi_group_cpu_offload_eager:
//                                CPUOffloadPolicy(pin_memory)
//   ignored_params               fully_shard(ignored_params=...): not sharded, not reduced,
//                                trained locally on each rank
//   multi_forward_module         TestFullyShard1DTrainingCore.test_multi_forward_module: the
//                                zoo's state_dict_model, outer(inner(x) + inner(x)), fully_shard
//                                on inner: a group that runs twice per forward (all-gathers per
//                                call) and reduces the sum of both calls' gradients
//   train_parity_multi_group     TestFullyShard1DTrainingCompose
//                                .test_train_parity_with_activation_checkpointing's module
//                                groupings on the Transformer: "block" (each block), "mem_eff"
//                                (layers[0]; the other blocks, the embeddings and (norm,
//                                output) each one fully_shard([...]) call, the embeddings'
//                                with set_unshard_in_backward(False); untied weights),
//                                "mem_eff_weight_tied" (fully_shard([tok_embeddings, output]),
//                                which share the tied weight; each block); reshard_after_forward
//                                True or False: one all-gather and one reduce-scatter per group
//                                whatever its number of modules
//   set_reduce_scatter_divide_factor (family fully_shard_comm)
//                                TestFullyShardCommunication.test_set_reduce_scatter_divide_factor:
//                                set_gradient_divide_factor(multiple * world) on every module,
//                                or on the root only (its own group)
#include <string>
#include <vector>

#include "conformance/fully_shard_plan.h"
#include "conformance/scenario_registry.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kKind = "mlp_stack";
constexpr const char* kTraining = "test_fully_shard_training.py::";

ParamSpec MicroBatches(int64_t value) {
  return ParamSpec::SizeInt("micro_batches", "backwards per optimizer step", value, /*minimum=*/1);
}

ParamSpec SwitchesOnChange() {
  return ParamSpec::SizeBool("switches_on_change",
                             "call the switches only where their value changes (before the "
                             "first and the last micro-batch of a step), not before every one",
                             false);
}

FullyShardPlan Base(const CaseParams& p) {
  FullyShardPlan plan = DecodePlanBase(kKind, p);
  plan.micro_batches = p.has("micro_batches") ? p.GetInt("micro_batches") : 1;
  return plan;
}

Scenario GradientAccumulation() {
  Scenario s = MakePlanScenario(
      "fully_shard_training/gradient_accumulation",
      "MLPStack, micro-batches per step without gradient sync (all modules or the root only; "
      "optionally without reshard after backward) or with sync in every backward: per "
      "micro-batch collective counts and bytes, gradient and parameter shards vs the oracle",
      std::string(kTraining) + "TestFullyShardGradientAccumulation::test_gradient_accumulation",
      kKind, "float64",
      {ParamSpec::Axis("mode",
                       "sync: every backward reduces; all: set_requires_gradient_sync(False) "
                       "(recurse) but for the last micro-batch; root_only: the same with "
                       "recurse=False (the root's group only)",
                       {"sync", "all", "root_only"}),
       ParamSpec::Axis("reshard_after_backward",
                       "False: set_reshard_after_backward(False) but for the last "
                       "micro-batch of a step (with the sync switch, or in mode sync alone)",
                       {"True", "False"}),
       SwitchesOnChange(), MicroBatches(3)},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = Base(p);
        const std::string mode = p.GetString("mode");
        plan.accumulate_without_sync = mode != "sync";
        plan.recurse = mode != "root_only";
        plan.no_reshard_after_backward = !p.GetBool("reshard_after_backward");
        plan.switches_on_change = p.GetBool("switches_on_change");
        return plan;
      });
  // The test sets the switches before every micro-batch; user code often sets them once per
  // change. The switches must persist: a set_requires_gradient_sync(False) (or
  // set_reshard_after_backward(False)) that lasts one backward only passes the test's loop,
  // while here the middle micro-batch then reduces (and reshards).
  s.info.extra_default_runs = {
      {2, {{"mode", "all"}, {"reshard_after_backward", "False"}, {"switches_on_change", "True"}}}};
  return s;
}

Scenario TrainParityHsdp() {
  Scenario s = MakePlanScenario(
      "fully_shard_training/train_parity_hsdp",
      "MLPStack on the 2-D (replicate, shard) mesh: reduce-scatter in the shard group, "
      "all-reduce across replicas (every micro-batch, or only the last with "
      "set_requires_all_reduce), gradients divided by the data-parallel size or the "
      "set_gradient_divide_factor; per micro-batch collective counts, shards of the shard group "
      "vs the oracle",
      std::string(kTraining) + "TestFullyShardHSDPTraining::test_train_parity_hsdp", kKind,
      "float64",
      {ParamSpec::Axis("defer_all_reduce",
                       "True: set_requires_all_reduce(False) (recurse) but for the last "
                       "micro-batch of a step (3 by default: two partial sums kept in a row)",
                       {"False", "True"}),
       ParamSpec::SizeDouble("divide_factor_multiple",
                             "set_gradient_divide_factor(multiple * world) on every module; 0: "
                             "unset (the data-parallel size)",
                             0.0),
       ParamSpec::SizeBool("force_sum_reduction",
                           "set_force_sum_reduction_for_comms(True) on every module (torch-2.15): "
                           "SUM collectives and a post-divide",
                           false),
       ParamSpec::SizeString("resume_all_reduce",
                             "with defer_all_reduce, the call that turns the all-reduce back on "
                             "for the last micro-batch: set_requires_all_reduce (True) or "
                             "set_requires_gradient_sync (True), which sets both switches",
                             "set_requires_all_reduce"),
       ParamSpec::SizeInt("shard_size",
                          "the mesh's shard size: (world / shard_size, shard_size); 0: the "
                          "smallest mesh with both dims >= 2",
                          0, /*minimum=*/0),
       SwitchesOnChange(), MicroBatches(3)},
      [](const CaseParams& p, int world) {
        FullyShardPlan plan = Base(p);
        plan.hsdp = true;
        plan.hsdp_shard_size = static_cast<int>(p.GetInt("shard_size"));
        plan.defer_all_reduce = p.GetBool("defer_all_reduce");
        plan.force_sum_reduction = p.GetBool("force_sum_reduction");
        const std::string resume = p.GetString("resume_all_reduce");
        FSDP_CHECK(resume == "set_requires_all_reduce" || resume == "set_requires_gradient_sync",
                   "resume_all_reduce must be set_requires_all_reduce or "
                   "set_requires_gradient_sync, not '",
                   resume, "'");
        plan.resume_all_reduce_with_gradient_sync = resume == "set_requires_gradient_sync";
        plan.switches_on_change = p.GetBool("switches_on_change");
        if (const double multiple = p.GetDouble("divide_factor_multiple"); multiple > 0.0) {
          plan.divide_factor = multiple * world;
        }
        return plan;
      });
  // The smallest (replicate, shard) mesh, 2 x 2, by default; 2 x 4 at world 8, where a default
  // run also sets a divide factor other than the data-parallel size: the reduce-scatter then
  // uses PREMUL_SUM, after which the all-reduce across replicas must SUM (not AVG). And the
  // seed's mesh at world 2, (2, 1): the reduce-scatter spans one rank, so only a divide factor
  // taken from the data-parallel size (shard x replicate, 2: AVG) instead of the shard group's
  // (1: SUM, then SUM across replicas) averages the gradients.
  // In float32 the reduce ops tell the policies apart (a float64 reduction always sums): extra
  // default runs reduce in float32 as is, with set_force_sum_reduction_for_comms on every
  // module, and with a divide factor equal to the shard size (2 on the 2 x 2 mesh), where the
  // reduce-scatter averages and the all-reduce across replicas sums. And the forced SUM with a
  // divide factor: the post-divide must be the factor, not the data-parallel size.
  // The deferred all-reduce turned back on by set_requires_gradient_sync(True), which sets
  // all_reduce_grads too (FSDPModule.set_requires_gradient_sync). And set_requires_all_reduce
  // called only where its value changes: the middle micro-batch relies on the switch holding.
  s.info.default_world = 4;
  s.info.extra_default_runs = {
      {8, {{"divide_factor_multiple", "2"}}},
      {2, {{"shard_size", "1"}}},
      {4, {{"defer_all_reduce", "True"}, {"resume_all_reduce", "set_requires_gradient_sync"}}},
      {4, {{"defer_all_reduce", "True"}, {"switches_on_change", "True"}}},
      {4, {{"dtype", "float32"}}},
      {4, {{"dtype", "float32"}, {"force_sum_reduction", "True"}}},
      {4, {{"dtype", "float32"}, {"force_sum_reduction", "True"}, {"divide_factor_multiple", "2"}}},
      {4, {{"dtype", "float32"}, {"divide_factor_multiple", "0.5"}}}};
  s.info.test_runs = {{8, {}}};
  return s;
}

Scenario TrainParityCpuOffload() {
  return MakePlanScenario(
      "fully_shard_training/train_parity_cpu_offload",
      "MLPStack with CPUOffloadPolicy: gradients on the CPU, values vs the oracle",
      std::string(kTraining) +
          "TestFullyShard1DTrainingCore::test_train_parity_multi_group_cpu_offload_eager",
      kKind, "float64",
      {ParamSpec::Axis("pin_memory", "CPUOffloadPolicy(pin_memory)", {"True", "False"}),
       MicroBatches(2)},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = Base(p);
        plan.offload_policy = fsdp2::OffloadPolicy::CPUOffload(p.GetBool("pin_memory"));
        return plan;
      });
}

Scenario IgnoredParams() {
  return MakePlanScenario(
      "fully_shard_training/ignored_params",
      "MLPStack with ignored_params (a weight of a sharded block and a bias of the root's): not "
      "sharded, not reduced (each rank steps its own gradient), the rest vs the oracle",
      "test_fully_shard_init.py (fully_shard(ignored_params=...))", kKind, "float64",
      {ParamSpec::SizeString("ignored", "comma-separated FQNs passed as ignored_params",
                             "0.in_proj.weight,2.out_proj.bias")},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = Base(p);
        const std::string text = p.GetString("ignored");
        size_t begin = 0;
        while (begin < text.size()) {
          const size_t comma = text.find(',', begin);
          const size_t end = comma == std::string::npos ? text.size() : comma;
          if (end > begin) plan.ignored_params.push_back(text.substr(begin, end - begin));
          begin = end + 1;
        }
        return plan;
      });
}

Scenario MultiForwardModule() {
  return MakePlanScenario(
      "fully_shard_training/multi_forward_module",
      "the test's MultiForwardModule, outer(inner(x) + inner(x)), fully_shard on inner then the "
      "root: inner's group runs twice per forward and reduces the sum of both calls' "
      "gradients; counts per call, gradient and parameter shards vs the oracle",
      std::string(kTraining) + "TestFullyShard1DTrainingCore::test_multi_forward_module",
      "state_dict_model", "float64", {MicroBatches(2)}, [](const CaseParams& p, int) {
        FullyShardPlan plan = DecodePlanBase("state_dict_model", p);
        plan.micro_batches = p.GetInt("micro_batches");
        plan.groups = {"inner"};
        plan.forward_calls = {{"inner", 2}};
        return plan;
      });
}

// The fully_shard calls of `grouping` before the root's (GroupModules syntax).
std::vector<std::string> ModuleGrouping(const std::string& grouping, int64_t n_layers) {
  std::vector<std::string> groups;
  auto layer = [](int64_t i) { return "layers." + std::to_string(i); };
  if (grouping == "mem_eff") {
    groups.push_back(layer(0));
    std::string rest;
    for (int64_t i = 1; i < n_layers; ++i) rest += (i > 1 ? ", " : "") + layer(i);
    if (!rest.empty()) groups.push_back(rest);
    groups.push_back("tok_embeddings, pos_embeddings");
    groups.push_back("norm, output");
    return groups;
  }
  if (grouping == "mem_eff_weight_tied") groups.push_back("tok_embeddings, output");
  for (int64_t i = 0; i < n_layers; ++i) groups.push_back(layer(i));
  return groups;
}

Scenario TrainParityMultiGroup() {
  Scenario s = MakePlanScenario(
      "fully_shard_training/train_parity_multi_group",
      "Transformer sharded per block or in memory-efficient groups of several modules, "
      "fully_shard([m1, m2]), with reshard_after_forward True or False: one all-gather and one "
      "reduce-scatter per group, gradient and parameter shards vs the oracle",
      std::string(kTraining) +
          "TestFullyShard1DTrainingCompose::test_train_parity_with_activation_checkpointing",
      "transformer", "float64",
      {ParamSpec::Axis("module_grouping",
                       "block: fully_shard on each block; mem_eff: layers[0], then "
                       "fully_shard([the other blocks]), fully_shard([tok_embeddings, "
                       "pos_embeddings]) with set_unshard_in_backward(False), "
                       "fully_shard([norm, output]); mem_eff_weight_tied: "
                       "fully_shard([tok_embeddings, output]), then each block",
                       {"block", "mem_eff", "mem_eff_weight_tied"}),
       ParamSpec::Axis("reshard_after_forward", "every fully_shard call's", {"True", "False"}),
       MicroBatches(1)},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = DecodePlanBase("transformer", p);
        plan.micro_batches = p.GetInt("micro_batches");
        plan.groups = ModuleGrouping(p.GetString("module_grouping"), p.GetInt("n_layers"));
        plan.reshard_after_forward = p.GetBool("reshard_after_forward");
        // As the test: the embeddings' backward needs no weights.
        if (p.GetString("module_grouping") == "mem_eff") {
          plan.no_unshard_in_backward = {"tok_embeddings, pos_embeddings"};
        }
        return plan;
      });
  s.excluded = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (p.GetString("module_grouping") == "mem_eff" && p.GetBool("weight_tying")) {
      return "mem_eff puts the embeddings and the output projection in different groups, which "
             "cannot share a weight (the test unties them: weight_tying=False)";
    }
    return std::nullopt;
  };
  // The default run ties the weights (mem_eff excluded); this one unties them, at an uneven
  // world. The seed's activation checkpointing (checkpoint_impl "utils":
  // ModelArgs.checkpoint_activations) in a default run too: each block's recompute in backward
  // runs FSDP's forward hooks again, which must neither reshard nor re-register anything.
  s.info.extra_default_runs = {
      {3, {{"weight_tying", "False"}}},
      {3, {{"weight_tying", "False"}, {"checkpoint_activations", "True"}}}};
  return s;
}

Scenario SetReduceScatterDivideFactor() {
  Scenario s = MakePlanScenario(
      "fully_shard_comm/set_reduce_scatter_divide_factor",
      "MLPStack with set_gradient_divide_factor(multiple * world) on every module (or the root "
      "only): gradients of the groups it was set on are the ranks' sum divided by that factor, "
      "the others' the ranks' average, vs the oracle",
      "test_fully_shard_comm.py::TestFullyShardCommunication::"
      "test_set_reduce_scatter_divide_factor",
      kKind, "float64",
      {ParamSpec::SizeDouble("divide_factor_multiple",
                             "the divide factor over the world size (the seed's 2)", 2.0),
       ParamSpec::SizeString("set_on",
                             "every: set_gradient_divide_factor on every FSDP module; root: on "
                             "the root only (its own group: the blocks keep the world size)",
                             "every"),
       MicroBatches(1)},
      [](const CaseParams& p, int world) {
        FullyShardPlan plan = Base(p);
        plan.divide_factor = p.GetDouble("divide_factor_multiple") * world;
        const std::string set_on = p.GetString("set_on");
        FSDP_CHECK(set_on == "every" || set_on == "root", "set_on must be every or root, not '",
                   set_on, "'");
        plan.divide_factor_root_only = set_on == "root";
        return plan;
      });
  // FSDPModule.set_gradient_divide_factor sets the called module's own group only: called on
  // the root, the blocks' gradients are still averaged (a setter that recursed would divide
  // them by the factor too).
  s.info.extra_default_runs = {{2, {{"set_on", "root"}}}};
  return s;
}

}  // namespace

void RegisterFullyShardTrainingScenarios(ScenarioRegistry& registry) {
  registry.Add(GradientAccumulation());
  registry.Add(TrainParityHsdp());
  registry.Add(TrainParityCpuOffload());
  registry.Add(IgnoredParams());
  registry.Add(MultiForwardModule());
  registry.Add(TrainParityMultiGroup());
  registry.Add(SetReduceScatterDivideFactor());
}

}  // namespace fsdp::conformance
