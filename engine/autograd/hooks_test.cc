// Hook order around one node (docs/autograd.md, "Hooks"), tensor hooks, retain_grad,
// post-accumulate-grad hooks, register_multi_grad_hook modes and end-of-backward callbacks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/testing/autograd_test_util.h"

namespace fsdp::autograd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Add;
using testing::Filled;
using testing::Mat;
using testing::Mul;
using testing::OrderRecorder;
using testing::Param;
using testing::RawMap;
using testing::Relu;
using testing::Sum;

Tensor Scaled(const Tensor& t, double factor) {
  return RawMap(t, [factor](double v) { return v * factor; });
}

// Splits a [1, 2n] row into two [1, n] rows (a two-output node).
TensorList Split2(const Tensor& x) {
  const std::vector<double> v = x.to_doubles();
  const int64_t n = static_cast<int64_t>(v.size()) / 2;
  Tensor a = Mat(1, n, std::vector<double>(v.begin(), v.begin() + n));
  Tensor b = Mat(1, n, std::vector<double>(v.begin() + n, v.end()));
  return record_function("SplitBackward0", {x}, {a, b}, [n](const TensorList& g) {
    std::vector<double> out = g[0].to_doubles();
    for (double d : g[1].to_doubles()) out.push_back(d);
    return TensorList{Mat(1, 2 * n, out)};
  });
}

TEST(AutogradHooksTest, OrderAroundOneNode) {
  std::vector<std::string> log;
  Tensor x = Param(1, 3, 1);
  Tensor h = Relu(Add(x, Filled(1, 3, 9)));  // non-leaf with a known producer
  Tensor loss = Sum(Add(h, h));
  // retain_grad registered first still runs after every tensor hook.
  retain_grad(h);
  register_hook(h, [&](const Tensor& g) {
    log.push_back("tensor_hook_1");
    return Scaled(g, 10.0);
  });
  register_hook(h, [&](const Tensor& g) {
    log.push_back("tensor_hook_2");
    EXPECT_EQ(g.to_doubles()[0], 20.0) << "sees the first hook's result and the summed grad";
  });
  h.grad_fn()->register_prehook([&](const TensorList& grads) {
    log.push_back("node_pre");
    EXPECT_EQ(grads[0].to_doubles()[0], 20.0);
  });
  h.grad_fn()->register_hook([&](const TensorList&, const TensorList&) { log.push_back("node_post"); });
  register_hook(x, [&](const Tensor&) { log.push_back("leaf_hook"); });
  auto acc = try_get_grad_accumulator(x);
  acc->register_prehook([&](const TensorList&) { log.push_back("acc_pre"); });
  register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    log.push_back("post_acc");
    EXPECT_TRUE(leaf.grad().defined());
  });
  acc->register_hook([&](const TensorList&, const TensorList&) { log.push_back("acc_post"); });
  loss.backward();
  EXPECT_THAT(log, ElementsAre("tensor_hook_1", "tensor_hook_2", "node_pre", "node_post",
                               "leaf_hook", "acc_pre", "post_acc", "acc_post"));
  EXPECT_EQ(h.grad().to_doubles(), (std::vector<double>{20, 20, 20}));
}

TEST(AutogradHooksTest, TensorHooksOfOneNodeRunInOrderOfFirstRegistration) {
  std::vector<std::string> log;
  Tensor x = Param(1, 4, 1);
  TensorList parts = Split2(x);
  register_hook(parts[1], [&](const Tensor&) { log.push_back("b1"); });
  register_hook(parts[0], [&](const Tensor&) { log.push_back("a1"); });
  register_hook(parts[1], [&](const Tensor&) { log.push_back("b2"); });
  Sum(Add(parts[0], parts[1])).backward();
  EXPECT_THAT(log, ElementsAre("b1", "b2", "a1"));
}

TEST(AutogradHooksTest, UnusedOutputHookSeesUndefinedAndBackwardSeesZeros) {
  Tensor x = Param(1, 4, 1);
  TensorList parts = Split2(x);
  bool hook_called = false;
  register_hook(parts[1], [&](const Tensor& g) {
    hook_called = true;
    EXPECT_FALSE(g.defined());
  });
  Sum(parts[0]).backward();
  EXPECT_TRUE(hook_called);
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{1, 1, 0, 0}));
}

TEST(AutogradHooksTest, HookOnTensorUsedTwiceFiresOnceWithSum) {
  Tensor x = Param(1, 2, 1);
  Tensor h = Relu(Add(x, Filled(1, 2, 3)));
  std::vector<std::vector<double>> calls;
  register_hook(h, [&](const Tensor& g) { calls.push_back(g.to_doubles()); });
  Sum(Add(Mul(h, Filled(1, 2, 4)), h)).backward();
  ASSERT_EQ(calls.size(), 1u);
  const std::vector<double> w = Filled(1, 2, 4).to_doubles();
  EXPECT_DOUBLE_EQ(calls[0][0], w[0] + 1);
  EXPECT_DOUBLE_EQ(calls[0][1], w[1] + 1);
}

TEST(AutogradHooksTest, HandlesRemoveHooks) {
  int tensor_calls = 0, pre_calls = 0, post_acc_calls = 0;
  Tensor x = Param(1, 2, 1);
  Tensor h = Relu(x);
  Tensor loss = Sum(h);
  RemovableHandle th = register_hook(h, [&](const Tensor&) { ++tensor_calls; });
  RemovableHandle ph = h.grad_fn()->register_prehook([&](const TensorList&) { ++pre_calls; });
  RemovableHandle ah = register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_acc_calls; });
  loss.backward(Tensor(), true);
  th.remove();
  ph.remove();
  RemovableHandle copy = ah;
  copy.remove();
  EXPECT_FALSE(ah.active());
  ah.remove();  // idempotent
  loss.backward();
  EXPECT_EQ(tensor_calls, 1);
  EXPECT_EQ(pre_calls, 1);
  EXPECT_EQ(post_acc_calls, 1);
}

TEST(AutogradHooksTest, RegisterHookRequiresGrad) {
  Tensor plain = Filled(1, 2, 1);
  try {
    register_hook(plain, [](const Tensor&) {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot register a hook on a tensor that doesn't require gradient"));
  }
  Tensor x = Param(1, 2, 1);
  Tensor h = Relu(x);
  EXPECT_THROW(register_post_accumulate_grad_hook(h, [](const Tensor&) {}), Error);
}

TEST(AutogradHooksTest, RetainGradClonesThenAccumulatesOutOfPlace) {
  Tensor x = Param(1, 2, 1);
  Tensor h = Relu(Add(x, Filled(1, 2, 5)));
  Tensor loss = Sum(Mul(h, Mat(1, 2, {3, 3})));
  retain_grad(h);
  EXPECT_TRUE(retains_grad(h));
  retain_grad(x);  // no-op on a leaf
  EXPECT_FALSE(retains_grad(x));
  loss.backward(Tensor(), true);
  Tensor first = h.grad();
  EXPECT_EQ(first.to_doubles(), (std::vector<double>{3, 3}));
  loss.backward();
  EXPECT_FALSE(h.grad().is_same(first));
  EXPECT_EQ(h.grad().to_doubles(), (std::vector<double>{6, 6}));
  EXPECT_EQ(first.to_doubles(), (std::vector<double>{3, 3}));
}

TEST(AutogradHooksTest, InPlaceOpMovesRetainGradButNotTensorHooks) {
  Tensor x = Param(1, 2, 1);
  Tensor h = Relu(Add(x, Filled(1, 2, 5)));
  auto old_fn = h.grad_fn();
  std::vector<double> old_hook_grad;
  register_hook(h, [&](const Tensor& g) { old_hook_grad = g.to_doubles(); });
  retain_grad(h);
  // h *= 2 in place: the output is the input tensor itself.
  Tensor doubled = Scaled(h, 2.0);
  h.impl()->storage = doubled.storage();
  record_function("MulBackward0", {h}, TensorList{h},
                  [](const TensorList& g) { return TensorList{Scaled(g[0], 2.0)}; });
  EXPECT_NE(h.grad_fn(), old_fn);
  std::vector<double> new_hook_grad;
  register_hook(h, [&](const Tensor& g) { new_hook_grad = g.to_doubles(); });
  Sum(Mul(h, Mat(1, 2, {3, 3}))).backward();
  EXPECT_EQ(new_hook_grad, (std::vector<double>{3, 3}));
  EXPECT_EQ(old_hook_grad, (std::vector<double>{6, 6}));
  EXPECT_EQ(h.grad().to_doubles(), (std::vector<double>{3, 3}));
  Tensor leaf = Param(1, 2, 2);
  EXPECT_THROW(record_function("MulBackward0", {leaf}, TensorList{leaf},
                               [](const TensorList& g) { return g; }),
               Error);
}

TEST(AutogradHooksTest, PostAccumulateGradHookOncePerBackwardPerLeaf) {
  Tensor w = Param(1, 2, 1);
  int calls = 0;
  register_post_accumulate_grad_hook(w, [&](const Tensor& leaf) {
    ++calls;
    EXPECT_TRUE(leaf.is_same(w));
  });
  Tensor loss = Sum(Add(Mul(w, w), w));  // three uses, one accumulation
  loss.backward(Tensor(), true);
  EXPECT_EQ(calls, 1);
  loss.backward();
  EXPECT_EQ(calls, 2);
}

TEST(AutogradHooksTest, MultiGradHookAllFiresOnceInsideLastTensorHook) {
  std::vector<std::string> log;
  Tensor x = Param(1, 2, 1);
  Tensor a = Relu(x);
  Tensor b = Mul(x, Filled(1, 2, 2));
  Tensor c = Relu(Param(1, 2, 3));  // not part of the loss
  std::vector<TensorList> calls;
  register_multi_grad_hook({a, b, c}, [&](const TensorList& grads) {
    log.push_back("multi");
    calls.push_back(grads);
  });
  a.grad_fn()->register_prehook([&](const TensorList&) { log.push_back("pre_a"); });
  b.grad_fn()->register_prehook([&](const TensorList&) { log.push_back("pre_b"); });
  Tensor loss = Add(Sum(a), Sum(b));
  loss.backward(Tensor(), true);
  // b's node is newer, so it runs first; the hook fires inside a's tensor hook.
  EXPECT_THAT(log, ElementsAre("pre_b", "multi", "pre_a"));
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls[0][0].defined());
  EXPECT_TRUE(calls[0][1].defined());
  EXPECT_FALSE(calls[0][2].defined());
  loss.backward();
  EXPECT_EQ(calls.size(), 2u);
}

TEST(AutogradHooksTest, MultiGradHookAnyFiresOncePerBackward) {
  Tensor x = Param(1, 2, 1);
  Tensor a = Relu(x);
  Tensor b = Mul(x, Filled(1, 2, 2));
  Tensor plain = Filled(1, 2, 3);  // ignored: does not require grad
  std::vector<std::vector<double>> calls;
  register_multi_grad_hook_any({a, b, plain}, [&](const Tensor& g) { calls.push_back(g.to_doubles()); });
  Tensor loss = Add(Sum(a), Sum(Mul(b, Mat(1, 2, {5, 5}))));
  loss.backward(Tensor(), true);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], (std::vector<double>{5, 5})) << "b's producer runs first";
  loss.backward();
  EXPECT_EQ(calls.size(), 2u);
  try {
    register_multi_grad_hook({a}, [](const TensorList&) {}, "some");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Expects mode to be one of ('all', 'any') but got some"));
  }
}

TEST(AutogradHooksTest, FinalCallbacksRunAfterAllNodesInFifoOrder) {
  std::vector<std::string> log;
  Tensor w = Param(1, 2, 1);
  Tensor h = Relu(w);
  Tensor loss = Sum(h);
  register_post_accumulate_grad_hook(w, [&](const Tensor&) { log.push_back("post_acc"); });
  int64_t callback_graph_id = -2;
  h.grad_fn()->register_prehook([&](const TensorList&) {
    log.push_back("relu");
    Engine::queue_callback([&] {
      log.push_back("cb1");
      callback_graph_id = current_graph_task_id();
      Engine::queue_callback([&] { log.push_back("cb3"); });
    });
    Engine::queue_callback([&] { log.push_back("cb2"); });
  });
  loss.backward();
  EXPECT_THAT(log, ElementsAre("relu", "post_acc", "cb1", "cb2", "cb3"));
  EXPECT_GE(callback_graph_id, 0);
  try {
    Engine::queue_callback([] {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Final callbacks can only be installed during backward pass."));
  }
}

TEST(AutogradHooksTest, WillEngineExecuteNode) {
  Tensor x = Param(1, 2, 1);
  Tensor a = Relu(x);
  Tensor unrelated = Relu(Param(1, 2, 2));
  Tensor loss = Sum(a);
  std::vector<bool> seen;
  loss.grad_fn()->register_prehook([&](const TensorList&) {
    seen.push_back(will_engine_execute_node(a.grad_fn()));
    seen.push_back(will_engine_execute_node(unrelated.grad_fn()));
    seen.push_back(will_engine_execute_node(try_get_grad_accumulator(x)));
    seen.push_back(will_engine_execute_node(loss.grad_fn()));  // the root is not "in the graph"
  });
  loss.backward();
  EXPECT_THAT(seen, ElementsAre(true, false, true, false));
  EXPECT_THROW(will_engine_execute_node(a.grad_fn()), Error);
}

}  // namespace
}  // namespace fsdp::autograd
