// Non-reentrant activation checkpointing (checkpoint.h): gradients identical to the plain
// forward, recompute exactly once per graph task at the documented moment, early stop, RNG
// preservation, nesting and error texts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/testing/autograd_test_util.h"

namespace fsdp::autograd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Dropout;
using testing::Filled;
using testing::Linear;
using testing::LinearParams;
using testing::MakeLinear;
using testing::OrderRecorder;
using testing::Param;
using testing::Relu;
using testing::Sum;

struct Model {
  Tensor x = Param(3, 4, 1);
  LinearParams lin0 = MakeLinear(4, 4, 10);
  LinearParams lin1 = MakeLinear(4, 5, 20);
  LinearParams lin2 = MakeLinear(5, 4, 30);
  double dropout = 0.0;
  std::vector<std::string>* log = nullptr;
  OrderRecorder* rec = nullptr;

  // The checkpointed block: lin2(relu(dropout(lin1(h)))), with markers.
  TensorList Block(const TensorList& in) {
    const std::string mode = is_recomputing() ? "recompute" : "forward";
    if (log) log->push_back("block_start(" + mode + ")");
    OrderRecorder* r = is_recomputing() ? nullptr : rec;
    Tensor h = Linear(in[0], lin1, r, "1");
    if (dropout > 0) h = Dropout(h, dropout);
    Tensor a = Relu(h);
    if (r) r->Label(a, "Relu");
    Tensor out = Linear(a, lin2, r, "2");
    if (log) log->push_back("block_end(" + mode + ")");
    return {out};
  }

  Tensor Loss(bool use_checkpoint, const CheckpointOptions& options = {}) {
    Tensor h = Linear(x, lin0, rec, "0");
    Tensor out;
    if (use_checkpoint) {
      out = checkpoint([this](const TensorList& in) { return Block(in); }, {h}, options)[0];
    } else {
      out = Block({h})[0];
    }
    Tensor loss = Sum(out);
    if (rec) rec->Label(loss, "Sum");
    return loss;
  }

  std::vector<std::vector<double>> Grads() const {
    return {x.grad().to_doubles(),           lin0.weight.grad().to_doubles(),
            lin0.bias.grad().to_doubles(),   lin1.weight.grad().to_doubles(),
            lin1.bias.grad().to_doubles(),   lin2.weight.grad().to_doubles(),
            lin2.bias.grad().to_doubles()};
  }
};

TEST(AutogradCheckpointTest, GradientsMatchAndRecomputeRunsOnceInsideFirstUnpackingNode) {
  Model plain;
  plain.Loss(false).backward();

  OrderRecorder rec;
  Model ckpt;
  ckpt.log = &rec.log;
  ckpt.rec = &rec;
  const uint64_t seq_before = sequence_number::peek();
  Tensor loss = ckpt.Loss(true);
  // One extra node: _NoopSaveInputsBackward (plain forward: 2 + 2 + 1 + 2 + 1 = 8 nodes).
  EXPECT_EQ(sequence_number::peek() - seq_before, 9u);
  rec.LabelLeaf(ckpt.x, "x");
  EXPECT_THAT(rec.log, ElementsAre("block_start(forward)", "block_end(forward)"));
  rec.Clear();
  loss.backward();
  EXPECT_THAT(rec.log,
              ElementsAre("Sum", "Addmm2", "block_start(recompute)", "Acc(b2)", "T2", "Acc(W2)",
                          "Relu", "Addmm1", "Acc(b1)", "T1", "Acc(W1)", "Addmm0", "Acc(b0)",
                          "Acc(x)", "T0", "Acc(W0)"));
  EXPECT_EQ(ckpt.Grads(), plain.Grads());
  EXPECT_FALSE(is_recomputing());
}

TEST(AutogradCheckpointTest, WithoutEarlyStopTheWholeFunctionReruns) {
  Model m;
  std::vector<std::string> log;
  m.log = &log;
  CheckpointOptions options;
  options.early_stop = false;
  Tensor loss = m.Loss(true, options);
  loss.backward();
  EXPECT_THAT(log, ElementsAre("block_start(forward)", "block_end(forward)",
                               "block_start(recompute)", "block_end(recompute)"));
}

TEST(AutogradCheckpointTest, EachGraphTaskRecomputesOnce) {
  Model m;
  std::vector<std::string> log;
  m.log = &log;
  Tensor loss = m.Loss(true);
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward();
  EXPECT_THAT(log, ElementsAre("block_start(forward)", "block_end(forward)",
                               "block_start(recompute)", "block_start(recompute)"));
  Model plain;
  Tensor plain_loss = plain.Loss(false);
  plain_loss.backward(Tensor(), true);
  plain_loss.backward();
  EXPECT_EQ(m.Grads(), plain.Grads());
}

TEST(AutogradCheckpointTest, DropoutRecomputeMatchesAndAmbientRngIsRestored) {
  // A full reset (manual_seed keeps already buffered words).
  Generator& gen = RankContext::Current().generator();
  gen = Generator(1234);
  Model plain;
  plain.dropout = 0.5;
  plain.Loss(false).backward();
  const Generator after_plain = gen;

  gen = Generator(1234);
  Model ckpt;
  ckpt.dropout = 0.5;
  ckpt.Loss(true).backward();
  EXPECT_EQ(ckpt.Grads(), plain.Grads());
  EXPECT_EQ(gen.offset(), after_plain.offset());
  Generator a = gen, b = after_plain;
  EXPECT_EQ(a.next_u64(), b.next_u64()) << "the recompute did not consume ambient randomness";
}

TEST(AutogradCheckpointTest, NoGradForwardCheckpointsNothing) {
  Model m;
  std::vector<std::string> log;
  m.log = &log;
  NoGradGuard no_grad;
  Tensor h = Filled(3, 4, 1);
  const size_t depth = saved_tensor_hooks_depth();
  CheckpointRegion region([&](const TensorList& in) { m.Block(in); }, {h});
  EXPECT_FALSE(region.hooks_active());
  EXPECT_EQ(saved_tensor_hooks_depth(), depth);
  Tensor out = m.Block({h})[0];
  region.exit();
  EXPECT_EQ(out.grad_fn(), nullptr);
}

TEST(AutogradCheckpointTest, ExplicitRegionForModuleWrappers) {
  // What a forward pre-hook / forward hook pair does: enter, run, exit.
  Model m;
  std::vector<std::string> log;
  m.log = &log;
  Tensor h = Linear(m.x, m.lin0);
  auto region = std::make_unique<CheckpointRegion>(
      [&m](const TensorList& in) { m.Block(in); }, TensorList{h});
  EXPECT_TRUE(region->hooks_active());
  Tensor out = m.Block({h})[0];
  region->exit();
  region->exit();  // idempotent
  region.reset();
  Sum(out).backward();
  EXPECT_THAT(log, ElementsAre("block_start(forward)", "block_end(forward)",
                               "block_start(recompute)"));
  Model plain;
  plain.Loss(false).backward();
  EXPECT_EQ(m.Grads(), plain.Grads());
}

TEST(AutogradCheckpointTest, NestedCheckpointsMatchPlainGradients) {
  Model plain;
  plain.Loss(false).backward();

  Model m;
  Tensor h0 = Linear(m.x, m.lin0);
  auto outer = [&m](const TensorList& in) {
    Tensor h = Linear(in[0], m.lin1);
    Tensor a = checkpoint([](const TensorList& inner_in) { return TensorList{Relu(inner_in[0])}; },
                          {h})[0];
    return TensorList{Linear(a, m.lin2)};
  };
  Sum(checkpoint(outer, {h0})[0]).backward();
  EXPECT_EQ(m.Grads(), plain.Grads());
}

TEST(AutogradCheckpointTest, DifferentRecomputeIsAnError) {
  Model m;
  int calls = 0;
  Tensor h = Linear(m.x, m.lin0);
  auto fn = [&](const TensorList& in) {
    ++calls;
    // The recompute saves one tensor fewer than the forward.
    Tensor a = calls == 1 ? Relu(Relu(in[0])) : Relu(in[0]);
    return TensorList{a};
  };
  CheckpointOptions options;
  options.early_stop = false;
  Tensor loss = Sum(checkpoint(fn, {h}, options)[0]);
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("torch.utils.checkpoint: A different number of tensors was "
                                    "saved during the original forward and recomputation."));
  }
}

TEST(AutogradCheckpointTest, SecondUnpackInOneGraphTaskIsAnError) {
  Tensor x = Param(1, 2, 1);
  auto fn = [](const TensorList& in) {
    SavedTensor saved(in[0]);
    Tensor out = in[0].clone();
    return TensorList{record_function("UnpackTwiceBackward", {in[0]}, out, [saved](const TensorList& g) {
      saved.unpack();
      saved.unpack();
      return TensorList{g[0]};
    })};
  };
  Tensor loss = Sum(checkpoint(fn, {x})[0]);
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Unpack is being triggered for a tensor that was already "
                                    "unpacked once"));
  }
}

}  // namespace
}  // namespace fsdp::autograd
