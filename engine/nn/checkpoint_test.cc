#include "engine/nn/checkpoint.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/autograd/checkpoint.h"
#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/testing/nn_test_util.h"

namespace fsdp::nn {
namespace {

using Names = std::vector<std::string>;

Names ParamNames(const Module& m) {
  Names out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

TEST(ModuleCheckpointWrapper, FqnsAndStateDictKeys) {
  auto seq = std::make_shared<Sequential>(std::vector<ModulePtr>{
      checkpoint_wrapper(std::make_shared<Linear>(3, 3)), std::make_shared<Linear>(3, 3)});
  EXPECT_EQ(ParamNames(*seq), (Names{"0._checkpoint_wrapped_module.weight",
                                     "0._checkpoint_wrapped_module.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(seq->state_dict().keys(), (Names{"0.weight", "0.bias", "1.weight", "1.bias"}));
  // named_parameters on the wrapper itself strips the prefix (ActivationWrapper override).
  auto wrapper = seq->child_as<CheckpointWrapper>("0");
  ASSERT_NE(wrapper, nullptr);
  EXPECT_EQ(ParamNames(*wrapper), (Names{"weight", "bias"}));
  EXPECT_EQ(wrapper->type_name(), "CheckpointWrapper");
  EXPECT_EQ(wrapper->wrapped_module()->type_name(), "Linear");

  // An unwrapped model's state dict loads into the wrapped one and back.
  auto plain = std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Linear>(3, 3), std::make_shared<Linear>(3, 3)});
  IncompatibleKeys keys = seq->load_state_dict(plain->state_dict());
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  EXPECT_EQ(seq->get_parameter("0._checkpoint_wrapped_module.weight").to_doubles(),
            plain->get_parameter("0.weight").to_doubles());
  plain->load_state_dict(seq->state_dict());
  // A wrapper at the root.
  auto root = checkpoint_wrapper(std::make_shared<Linear>(2, 2));
  EXPECT_EQ(root->state_dict().keys(), (Names{"weight", "bias"}));
  EXPECT_EQ(root->state_dict("m.").keys(), (Names{"m.weight", "m.bias"}));
  EXPECT_TRUE(
      root->load_state_dict(std::make_shared<Linear>(2, 2)->state_dict()).missing_keys.empty());
}

TEST(ModuleCheckpointWrapper, ReplaceByPrefixMovesKeysToTheEnd) {
  StateDict sd;
  sd.insert("a.x", Tensor::zeros({1}));
  sd.insert("b", Tensor::zeros({1}));
  sd.insert("a.y", Tensor::zeros({1}));
  ReplaceByPrefix(sd, "a.", "c.");
  EXPECT_EQ(sd.keys(), (Names{"b", "c.x", "c.y"}));
  EXPECT_THROW(ReplaceByPrefix(sd, "c.", "c."), Error);
}

TEST(ModuleCheckpointWrapper, ApplyActivationCheckpointingOnTransformer) {
  auto model = std::make_shared<Transformer>(ModelArgs{});
  const StateDict before = model->state_dict();
  apply_activation_checkpointing(
      model, [](Module& m) { return dynamic_cast<TransformerBlock*>(&m) != nullptr; });
  Names names = ParamNames(*model);
  EXPECT_EQ(names[2], "layers.0._checkpoint_wrapped_module.attention_norm.weight");
  EXPECT_EQ(names.back(), "norm.bias");
  EXPECT_EQ(model->state_dict().keys(), before.keys());
  EXPECT_TRUE(model->load_state_dict(before).missing_keys.empty());
  EXPECT_EQ(model->layers()[1]->type_name(), "CheckpointWrapper");
  // The root is never wrapped; shared children are wrapped under their first name only.
  auto dummy = std::make_shared<TestDummyModel>();
  apply_activation_checkpointing(dummy, [](Module& m) { return m.type_name() == "Sequential"; });
  EXPECT_EQ(dummy->child("net2")->type_name(), "CheckpointWrapper");
  EXPECT_EQ(dummy->child("net3")->type_name(), "Sequential");
}

// Loss and gradients of `model` on fixed tokens, with the rank generator reseeded first.
struct RunResult {
  double loss = 0.0;
  std::map<std::string, std::vector<double>> grads;
};

RunResult RunModel(Module& model, const Tensor& tokens) {
  ManualSeed(77);
  Tensor loss = testing::WeightedSum(model(tokens));
  loss.backward();
  RunResult r;
  r.loss = loss.item();
  for (const auto& [name, p] : model.named_parameters()) {
    std::string key = name;
    for (size_t pos; (pos = key.find(kCheckpointPrefix)) != std::string::npos;) {
      key.erase(pos, std::string(kCheckpointPrefix).size());
    }
    r.grads[key] = p.grad().to_doubles();
  }
  return r;
}

TEST(ModuleCheckpoint, AllThreeFormsGiveTheUncheckpointedGradients) {
  ManualSeed(5);
  auto reference = std::make_shared<Transformer>(ModelArgs{});  // dropout 0.1, training
  const StateDict weights = reference->state_dict();
  Tensor tokens = Tensor::randint(0, 8, {2, 8});
  const RunResult expected = RunModel(*reference, tokens);

  ModelArgs ac_args;
  ac_args.checkpoint_activations = true;
  auto function_form = std::make_shared<Transformer>(ac_args);
  function_form->load_state_dict(weights);

  auto utils_form = std::make_shared<Transformer>(ModelArgs{});
  utils_form->load_state_dict(weights);
  apply_activation_checkpointing(
      utils_form, [](Module& m) { return dynamic_cast<TransformerBlock*>(&m) != nullptr; });

  auto composable_form = std::make_shared<Transformer>(ModelArgs{});
  composable_form->load_state_dict(weights);
  for (const ModulePtr& block : composable_form->layers()) checkpoint(block);

  for (Module* model :
       {static_cast<Module*>(function_form.get()), static_cast<Module*>(utils_form.get()),
        static_cast<Module*>(composable_form.get())}) {
    const RunResult got = RunModel(*model, tokens);
    EXPECT_EQ(got.loss, expected.loss);
    ASSERT_EQ(got.grads.size(), expected.grads.size());
    for (const auto& [name, g] : expected.grads) {
      ASSERT_TRUE(got.grads.count(name)) << name;
      EXPECT_EQ(got.grads.at(name), g) << name;
    }
  }
}

TEST(ModuleCheckpoint, ComposableRecomputeRerunsOtherHooks) {
  auto block = std::make_shared<TransformerBlock>(ModelArgs{.dropout_p = 0.0});
  std::vector<std::string> log;
  auto logger = [&log](const std::string& what) {
    return [&log, what](Module&, const Value&) -> std::optional<Value> {
      log.push_back(what + (autograd::is_recomputing() ? " (recompute)" : ""));
      return std::nullopt;
    };
  };
  block->register_forward_pre_hook(logger("block pre before"));
  checkpoint(block);
  EXPECT_TRUE(HasComposableCheckpoint(*block));
  EXPECT_THROW(checkpoint(block), Error);
  block->register_forward_pre_hook(logger("block pre after"));
  block->get_submodule("attention.wq")->register_forward_pre_hook(logger("wq"));
  EXPECT_EQ(ParamNames(*block)[0], "attention_norm.weight");  // FQNs unchanged

  Tensor x = Tensor::randn({2, 3, 16});
  x.set_requires_grad(true);
  Tensor loss = ::fsdp::sum((*block)(x).tensor());
  EXPECT_EQ(log, (Names{"block pre before", "block pre after", "wq"}));
  log.clear();
  loss.backward();
  EXPECT_EQ(log, (Names{"block pre before (recompute)", "block pre after (recompute)",
                        "wq (recompute)"}));
  EXPECT_TRUE(x.grad().defined());
}

TEST(ModuleCheckpoint, WrapperRecomputeRunsInnerHooksOnly) {
  auto inner = std::make_shared<FeedForward>(4, 8, 0.0);
  auto wrapper = checkpoint_wrapper(inner);
  int wrapper_calls = 0;
  int inner_calls = 0;
  wrapper->register_forward_pre_hook([&](Module&, const Value&) -> std::optional<Value> {
    ++wrapper_calls;
    return std::nullopt;
  });
  inner->register_forward_pre_hook([&](Module&, const Value&) -> std::optional<Value> {
    ++inner_calls;
    return std::nullopt;
  });
  Tensor x = Tensor::randn({3, 4});
  x.set_requires_grad(true);
  Tensor loss = ::fsdp::sum((*wrapper)(x).tensor());
  EXPECT_EQ(wrapper_calls, 1);
  EXPECT_EQ(inner_calls, 1);
  loss.backward();
  EXPECT_EQ(wrapper_calls, 1);
  EXPECT_EQ(inner_calls, 2);
}

}  // namespace
}  // namespace fsdp::nn
