// Execution order of the backward engine on graphs shaped like the seeds' models, checked
// against the verified PyTorch orders of docs/autograd.md, "Worked examples", plus the heap tie
// order ("Tie order"), multi-root order, retain_graph, inputs=/grad(), reentrant backward and per-thread
// independence. Set FSDP_AUTOGRAD_PRINT_ORDERS=1 to print the measured orders.
#include <cstdlib>
#include <iostream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/testing/autograd_test_util.h"

namespace fsdp::autograd {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::Add;
using testing::Cat;
using testing::Filled;
using testing::Join;
using testing::Linear;
using testing::MakeLinear;
using testing::Mm;
using testing::OrderRecorder;
using testing::Param;
using testing::Relu;
using testing::Sum;
using testing::T;

void MaybePrint(const std::string& title, const std::vector<std::string>& order) {
  if (std::getenv("FSDP_AUTOGRAD_PRINT_ORDERS") != nullptr) {
    std::cout << title << ": " << Join(order) << "\n";
  }
}

// (a) y = lin2(relu(lin1(x))), loss = y.sum().
std::vector<std::string> RunMlp(bool x_requires_grad) {
  OrderRecorder rec;
  Tensor x = Filled(3, 4, 1);
  if (x_requires_grad) x.set_requires_grad(true);
  auto lin1 = MakeLinear(4, 5, 10);
  auto lin2 = MakeLinear(5, 2, 20);
  Tensor h = Linear(x, lin1, &rec, "1");
  Tensor r = Relu(h);
  rec.Label(r, "Relu");
  Tensor y = Linear(r, lin2, &rec, "2");
  Tensor loss = Sum(y);
  rec.Label(loss, "Sum");
  if (x_requires_grad) rec.LabelLeaf(x, "x");
  loss.backward();
  return rec.log;
}

TEST(AutogradOrderTest, MlpMatchesPyTorch) {
  const auto order = RunMlp(true);
  MaybePrint("(a) mlp", order);
  EXPECT_THAT(order, ElementsAre("Sum", "Addmm2", "Acc(b2)", "T2", "Acc(W2)", "Relu", "Addmm1",
                                 "Acc(b1)", "Acc(x)", "T1", "Acc(W1)"));
}

TEST(AutogradOrderTest, MlpWithoutInputGradMatchesPyTorch) {
  const auto order = RunMlp(false);
  MaybePrint("(a') mlp, x without grad", order);
  EXPECT_THAT(order, ElementsAre("Sum", "Addmm2", "Acc(b2)", "T2", "Acc(W2)", "Relu", "Addmm1",
                                 "Acc(b1)", "T1", "Acc(W1)"));
}

// (b) three residual blocks h = h + f_i(h).
TEST(AutogradOrderTest, ResidualBlocksMatchPyTorch) {
  OrderRecorder rec;
  Tensor x = Param(2, 3, 1);
  Tensor h = x;
  std::vector<testing::LinearParams> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(MakeLinear(3, 3, 100 + i));
  for (int i = 0; i < 3; ++i) {
    const std::string tag = std::to_string(i);
    Tensor f = Linear(h, blocks[i], &rec, tag);
    h = Add(h, f);
    rec.Label(h, "Add" + tag);
  }
  Tensor loss = Sum(h);
  rec.Label(loss, "Sum");
  rec.LabelLeaf(x, "x");
  loss.backward();
  MaybePrint("(b) residual", rec.log);
  EXPECT_THAT(rec.log, ElementsAre("Sum", "Add2", "Addmm2", "Acc(b2)", "T2", "Acc(W2)", "Add1",
                                   "Addmm1", "Acc(b1)", "T1", "Acc(W1)", "Add0", "Addmm0",
                                   "Acc(b0)", "Acc(x)", "T0", "Acc(W0)"));
}

// (c) a trunk feeding two heads.
struct TwoHeads {
  OrderRecorder rec;
  Tensor x = Param(2, 3, 1);
  testing::LinearParams trunk = MakeLinear(3, 4, 10);
  testing::LinearParams head1 = MakeLinear(4, 2, 20);
  testing::LinearParams head2 = MakeLinear(4, 2, 30);
  Tensor o1, o2;

  TwoHeads() {
    Tensor t = Linear(x, trunk, &rec, "_t");
    o1 = Linear(t, head1, &rec, "_h1");
    o2 = Linear(t, head2, &rec, "_h2");
    rec.LabelLeaf(x, "x");
  }
};

TEST(AutogradOrderTest, TwoHeadsWithRetainGraphMatchPyTorch) {
  TwoHeads m;
  Tensor s2 = Sum(m.o2);
  m.rec.Label(s2, "Sum2");
  s2.backward(Tensor(), /*retain_graph=*/true);
  MaybePrint("(c) head 2, retain_graph", m.rec.log);
  EXPECT_THAT(m.rec.log, ElementsAre("Sum2", "Addmm_h2", "Acc(b_h2)", "T_h2", "Acc(W_h2)",
                                     "Addmm_t", "Acc(b_t)", "Acc(x)", "T_t", "Acc(W_t)"));
  const std::vector<double> trunk_grad_1 = m.trunk.weight.grad().to_doubles();
  Tensor trunk_grad_tensor = m.trunk.weight.grad();
  m.rec.Clear();
  Tensor s1 = Sum(m.o1);
  m.rec.Label(s1, "Sum1");
  s1.backward();
  MaybePrint("(c) then head 1", m.rec.log);
  EXPECT_THAT(m.rec.log, ElementsAre("Sum1", "Addmm_h1", "Acc(b_h1)", "T_h1", "Acc(W_h1)",
                                     "Addmm_t", "Acc(b_t)", "Acc(x)", "T_t", "Acc(W_t)"));
  // The trunk's grads were summed in place across both calls.
  EXPECT_TRUE(m.trunk.weight.grad().is_same(trunk_grad_tensor));
  EXPECT_NE(m.trunk.weight.grad().to_doubles(), trunk_grad_1);
}

TEST(AutogradOrderTest, TwoHeadsJointLossMatchPyTorch) {
  TwoHeads m;
  Tensor s1 = Sum(m.o1);
  Tensor s2 = Sum(m.o2);
  Tensor loss = Add(s1, s2);
  m.rec.Label(s1, "Sum1");
  m.rec.Label(s2, "Sum2");
  m.rec.Label(loss, "Add");
  loss.backward();
  MaybePrint("(c') joint loss", m.rec.log);
  EXPECT_THAT(m.rec.log, ElementsAre("Add", "Sum2", "Sum1", "Addmm_h2", "Acc(b_h2)", "T_h2",
                                     "Acc(W_h2)", "Addmm_h1", "Acc(b_h1)", "T_h1", "Acc(W_h1)",
                                     "Addmm_t", "Acc(b_t)", "Acc(x)", "T_t", "Acc(W_t)"));
}

TEST(AutogradOrderTest, SecondBackwardThroughReleasedGraphFails) {
  TwoHeads m;
  Sum(m.o2).backward();  // no retain_graph: the trunk's saved tensors are freed
  try {
    Sum(m.o1).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("Trying to backward through the graph a second time (or "
                                    "directly access saved tensors after they have already been "
                                    "freed)"));
    EXPECT_THAT(e.what(), HasSubstr("Specify retain_graph=True"));
  }
  // The engine is usable afterwards on this thread.
  Tensor a = Param(1, 2, 5);
  Sum(a).backward();
  EXPECT_EQ(a.grad().to_doubles(), (std::vector<double>{1, 1}));
}

// (d) a tied weight E used twice.
TEST(AutogradOrderTest, TiedWeightMatchesPyTorch) {
  OrderRecorder rec;
  Tensor x = Param(2, 3, 1);
  Tensor e = Param(3, 3, 2);
  auto mid = MakeLinear(3, 3, 30);
  int post_acc_calls = 0;
  register_post_accumulate_grad_hook(e, [&](const Tensor& leaf) {
    ++post_acc_calls;
    rec.log.push_back("post_acc(E)");
    EXPECT_TRUE(leaf.grad().defined());
  });
  Tensor te = T(e);
  Tensor z = Mm(x, te);  // linear(x, E) without bias
  rec.Label(te, "T_E");
  rec.Label(z, "Mm1");
  Tensor z2 = Mm(z, e);
  rec.Label(z2, "Mm2");
  Tensor r = Relu(z2);
  rec.Label(r, "Relu");
  Tensor y = Linear(r, mid, &rec, "_m");
  Tensor loss = Sum(y);
  rec.Label(loss, "Sum");
  rec.LabelLeaf(x, "x");
  rec.LabelLeaf(e, "E");
  loss.backward();
  MaybePrint("(d) tied weight", rec.log);
  EXPECT_THAT(rec.log, ElementsAre("Sum", "Addmm_m", "Acc(b_m)", "T_m", "Acc(W_m)", "Relu", "Mm2",
                                   "Mm1", "Acc(x)", "T_E", "Acc(E)", "post_acc(E)"));
  EXPECT_EQ(post_acc_calls, 1);
}

// docs/autograd.md, "Tie order": k AccumulateGrads made ready together come out in libstdc++
// heap order.
TEST(AutogradOrderTest, SimultaneousAccumulateGradsFollowHeapOrder) {
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {3, {0, 1, 2}}, {4, {0, 2, 1, 3}}, {5, {0, 2, 4, 1, 3}}, {6, {0, 2, 5, 4, 1, 3}},
      {9, {0, 2, 6, 8, 5, 7, 4, 1, 3}}};
  for (const auto& [k, expected] : cases) {
    OrderRecorder rec;
    TensorList leaves;
    for (int i = 0; i < k; ++i) leaves.push_back(Param(1, 1, 50 + i));
    Tensor cat = Cat(leaves);
    for (int i = 0; i < k; ++i) rec.LabelLeaf(leaves[i], std::to_string(i));
    Sum(cat).backward();
    std::vector<std::string> expected_labels;
    for (int i : expected) expected_labels.push_back("Acc(" + std::to_string(i) + ")");
    MaybePrint("ties k=" + std::to_string(k), rec.log);
    EXPECT_THAT(rec.log, ElementsAreArray(expected_labels)) << "k = " << k;
  }
}

// docs/autograd.md, "Multi-root backward": several roots run under a GraphRoot; the
// later-created root's branch runs first.
TEST(AutogradOrderTest, MultiRootRunsNewestBranchFirst) {
  OrderRecorder rec;
  Tensor a = Param(2, 2, 1);
  Tensor u = Relu(a);
  Tensor su = Sum(u);
  Tensor v = Relu(a);
  Tensor sv = Sum(v);
  rec.Label(u, "Relu_u");
  rec.Label(v, "Relu_v");
  rec.Label(su, "Sum_u");
  rec.Label(sv, "Sum_v");
  rec.LabelLeaf(a, "a");
  const uint64_t before = sequence_number::peek();
  backward({su, sv});
  EXPECT_EQ(sequence_number::peek(), before + 1) << "GraphRoot takes one sequence number";
  EXPECT_THAT(rec.log, ElementsAre("Sum_v", "Relu_v", "Sum_u", "Relu_u", "Acc(a)"));
}

TEST(AutogradOrderTest, SequenceNumbersAreCreationOrderAndAccumulateGradIsMax) {
  Tensor w = Param(2, 2, 1);
  const uint64_t start = sequence_number::peek();
  Tensor wt = T(w);
  Tensor s = Sum(wt);
  EXPECT_EQ(wt.grad_fn()->sequence_nr(), start);
  EXPECT_EQ(s.grad_fn()->sequence_nr(), start + 1);
  EXPECT_EQ(try_get_grad_accumulator(w)->sequence_nr(), UINT64_MAX);
  EXPECT_EQ(try_get_grad_accumulator(w)->name(), "AccumulateGrad");
  EXPECT_EQ(wt.grad_fn()->name(), "TBackward0");
  // One AccumulateGrad per leaf while a graph holds it.
  Tensor s2 = Sum(T(w));
  EXPECT_EQ(s2.grad_fn()->next_edge(0).function->next_edge(0).function,
            try_get_grad_accumulator(w));
  // Ops on tensors that need no grad record nothing and take no number.
  Tensor c = Filled(2, 2, 3);
  const uint64_t before = sequence_number::peek();
  Tensor d = Sum(T(c));
  EXPECT_EQ(sequence_number::peek(), before);
  EXPECT_EQ(d.grad_fn(), nullptr);
  {
    NoGradGuard no_grad;
    Tensor e = T(w);
    EXPECT_EQ(e.grad_fn(), nullptr);
    EXPECT_FALSE(e.requires_grad());
  }
}

TEST(AutogradOrderTest, AccumulateGradCacheDiesWithItsGraphs) {
  Tensor w = Param(2, 2, 1);
  std::weak_ptr<Node> first;
  {
    Tensor s = Sum(T(w));
    first = try_get_grad_accumulator(w);
    EXPECT_FALSE(first.expired());
  }
  EXPECT_TRUE(first.expired());
  EXPECT_EQ(try_get_grad_accumulator(w), nullptr);
}

TEST(AutogradOrderTest, GradientAccumulatesAcrossBackwardsAndSetToNone) {
  Tensor w = Param(1, 3, 1);
  Sum(w).backward();
  Tensor g1 = w.grad();
  EXPECT_EQ(g1.to_doubles(), (std::vector<double>{1, 1, 1}));
  Sum(Add(w, w)).backward();
  EXPECT_TRUE(w.grad().is_same(g1)) << "in-place accumulation keeps the .grad tensor";
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{3, 3, 3}));
  w.set_grad(Tensor());  // set_to_none
  Sum(w).backward();
  EXPECT_FALSE(w.grad().is_same(g1));
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{1, 1, 1}));
}

TEST(AutogradOrderTest, BackwardInputsRestrictsExecution) {
  OrderRecorder rec;
  Tensor a = Param(1, 2, 1);
  Tensor b = Param(1, 2, 2);
  Tensor c = Param(1, 2, 3);
  int c_hook_calls = 0;
  register_hook(c, [&](const Tensor&) { ++c_hook_calls; });
  Tensor loss = Add(Sum(Mm(a, T(b))), Sum(c));
  rec.LabelLeaf(a, "a");
  rec.LabelLeaf(b, "b");
  rec.LabelLeaf(c, "c");
  backward({loss}, {}, std::nullopt, false, {b});
  EXPECT_THAT(rec.log, ElementsAre("Acc(b)"));
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(c.grad().defined());
  EXPECT_TRUE(b.grad().defined());
  EXPECT_EQ(c_hook_calls, 0);
}

TEST(AutogradOrderTest, GradReturnsGradientsWithoutTouchingDotGrad) {
  OrderRecorder rec;
  Tensor a = Param(1, 2, 1);
  Tensor b = Param(1, 2, 2);
  Tensor unused = Param(1, 2, 3);
  int a_hook_calls = 0;
  register_hook(a, [&](const Tensor&) { ++a_hook_calls; });
  Tensor loss = Sum(testing::Mul(a, b));
  rec.LabelLeaf(a, "a");
  TensorList grads = grad({loss}, {a}, {}, /*retain_graph=*/true);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(grads[0].to_doubles(), b.to_doubles());
  EXPECT_FALSE(a.grad().defined());
  EXPECT_TRUE(rec.log.empty()) << "AccumulateGrad does not run under grad()";
  EXPECT_EQ(a_hook_calls, 1) << "leaf tensor hooks fire under grad()";
  EXPECT_THROW(grad({loss}, {unused}, {}, true), Error);
  TensorList allowed = grad({loss}, {unused}, {}, true, false, /*allow_unused=*/true);
  EXPECT_FALSE(allowed[0].defined());
}

TEST(AutogradOrderTest, ImplicitGradientOnlyForScalars) {
  Tensor a = Param(2, 2, 1);
  Tensor r = Relu(a);
  try {
    r.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("grad can be implicitly created only for scalar outputs"));
  }
  Tensor plain = Filled(1, 1, 1);
  try {
    plain.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("element 0 of tensors does not require grad and does not have a grad_fn"));
  }
  r.backward(Tensor::ones({2, 2}, DType::kFloat64));
  EXPECT_TRUE(a.grad().defined());
}

// A backward started inside a hook is a deeper graph task: it runs to completion before the
// outer task's next node.
TEST(AutogradOrderTest, ReentrantBackwardRunsBeforeOuterNodes) {
  OrderRecorder rec;
  Tensor a = Param(1, 2, 1);
  Tensor b = Param(1, 2, 2);
  Tensor ra = Relu(a);
  Tensor outer = Sum(testing::Mul(ra, ra));
  rec.Label(ra, "Relu_outer");
  rec.Label(outer, "Sum_outer");
  int64_t outer_id = -1;
  int64_t inner_id = -1;
  outer.grad_fn()->register_hook([&](const TensorList&, const TensorList&) {
    outer_id = current_graph_task_id();
    EXPECT_FALSE(GradMode::is_enabled()) << "hooks run with grad mode = create_graph";
    EnableGradGuard enable_grad;
    Tensor inner = Sum(Relu(b));
    rec.Label(inner, "Sum_inner");
    rec.Label(inner.grad_fn()->next_edge(0).function, "Relu_inner");
    inner.grad_fn()->register_hook([&](const TensorList&, const TensorList&) {
      inner_id = current_graph_task_id();
    });
    inner.backward();
    rec.log.push_back("inner_done");
  });
  outer.backward();
  EXPECT_THAT(rec.log, ElementsAre("Sum_outer", "Sum_inner", "Relu_inner", "inner_done",
                                   "Relu_outer"));
  EXPECT_NE(outer_id, inner_id);
  EXPECT_TRUE(b.grad().defined());
  EXPECT_EQ(current_graph_task_id(), -1);
}

TEST(AutogradOrderTest, ErrorInsideBackwardPropagatesAndEngineRecovers) {
  Tensor a = Param(1, 2, 1);
  Tensor s = Sum(Relu(a));
  s.grad_fn()->register_prehook([](const TensorList&) {
    FSDP_THROW(ErrorCode::kAborted, "hook failed");
  });
  EXPECT_THROW(s.backward(), Error);
  EXPECT_FALSE(is_backward_running());
  Tensor b = Param(1, 2, 2);
  Sum(b).backward();
  EXPECT_TRUE(b.grad().defined());
}

// Ranks as threads: each thread has its own sequence counter, grad mode and ready queue.
TEST(AutogradOrderTest, ThreadsAreIndependent) {
  std::vector<std::vector<std::string>> orders(4);
  std::vector<uint64_t> first_seq(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &orders, &first_seq] {
      first_seq[t] = sequence_number::peek();
      if (t % 2 == 1) GradMode::set_enabled(true);
      orders[t] = RunMlp(true);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(first_seq[t], 0u);
    EXPECT_EQ(orders[t], orders[0]);
  }
}

}  // namespace
}  // namespace fsdp::autograd
