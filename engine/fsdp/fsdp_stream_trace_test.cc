// FSDP2's stream and event contract (docs/fsdp-behaviour.md, "Streams and the implicit forward
// prefetch"), checked on the CPU through the
// StreamTrace of engine/fsdp/comm_context.h: the CPU path issues the same stream waits, event
// records and guards as the CUDA path (they are no-ops there), so the synchronisation a GPU
// run depends on is verified on every machine. A sharded Transformer (blocks + root) trains
// two steps on 4 threaded ranks; forward, backward and the second forward are traced apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp2::ReshardAfterForward;
using fsdp2::StreamOp;
using Kind = StreamOp::Kind;

struct Traces {
  fsdp2::StreamTrace forward;
  fsdp2::StreamTrace backward;  // backward and its end-of-backward callback
  fsdp2::StreamTrace second_forward;
  int64_t post_optim_event = 0;  // the id of the event given to set_post_optim_event (or 0)
};

Traces TraceTraining(RankEnv& env, ReshardAfterForward raf, bool post_optim_event) {
  nn::ModelArgs args;
  args.dropout_p = 0.0;
  args.n_layers = 3;
  auto model = std::make_shared<nn::Transformer>(args);
  fsdp2::FullyShardOptions options;
  options.reshard_after_forward = raf;
  for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
  fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
  optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 0.1});
  const Tensor inp = Tensor::randint(0, args.vocab_size, {2 * env.world_size, 8})
                         .narrow(0, 2 * env.rank, 2)
                         .clone();
  Traces traces;
  Tensor loss;
  {
    const fsdp2::StreamTraceScope scope(&traces.forward);
    loss = sum((*model)(inp).tensor());
  }
  {
    const fsdp2::StreamTraceScope scope(&traces.backward);
    loss.backward();
  }
  optim.step();
  optim.zero_grad();
  if (post_optim_event) {
    const fsdp2::CommEvent event = fsdp2::CommStream::Current(Device::CPU()).record_event();
    traces.post_optim_event = event.id();
    root.set_post_optim_event(event);
  }
  {
    const fsdp2::StreamTraceScope scope(&traces.second_forward);
    (void)(*model)(inp);
  }
  return traces;
}

std::vector<Traces> TraceRanks(ReshardAfterForward raf, bool post_optim_event = false) {
  RunRanksOptions options;
  options.seed = 7;
  // World 4, so that reshard_after_forward=2 reshards to a real post-forward mesh of 2.
  auto results = RunRanks(
      4, [&](RankEnv& env) { return TraceTraining(env, raf, post_optim_event); }, options);
  EXPECT_TRUE(results.all_ok()) << results.summary();
  return results.all_ok() ? results.values() : std::vector<Traces>{};
}

bool Is(const StreamOp& op, Kind kind, const std::string& stream) {
  return op.kind == kind && op.stream == stream;
}

// Indices of the events recorded on `stream`.
std::vector<size_t> Records(const fsdp2::StreamTrace& trace, const std::string& stream) {
  std::vector<size_t> out;
  for (size_t i = 0; i < trace.ops().size(); ++i) {
    if (Is(trace.ops()[i], Kind::kRecord, stream)) out.push_back(i);
  }
  return out;
}

// True when `stream` waits for the event of ops()[record] later in the trace.
bool WaitedBy(const fsdp2::StreamTrace& trace, size_t record, const std::string& stream) {
  const int64_t id = trace.ops()[record].event;
  for (size_t i = record + 1; i < trace.ops().size(); ++i) {
    const StreamOp& op = trace.ops()[i];
    if (Is(op, Kind::kWaitEvent, stream) && op.event == id) return true;
  }
  return false;
}

void ExpectGuardsBalanced(const fsdp2::StreamTrace& trace) {
  int depth = 0;
  for (const StreamOp& op : trace.ops()) {
    depth += op.kind == Kind::kEnterGuard ? 1 : op.kind == Kind::kExitGuard ? -1 : 0;
    ASSERT_GE(depth, 0) << trace.str();
  }
  EXPECT_EQ(depth, 0) << trace.str();
}

// Every all-gather (an event recorded on the all-gather stream) is ordered after its copy-in
// and waited for by the current stream (the copy-out); the copy-in stream never waits for the
// whole current stream except where `allowed_copy_in_waits` says (the root pre-forward).
void ExpectAllGatherContract(const fsdp2::StreamTrace& trace, int allowed_copy_in_waits) {
  const std::vector<size_t> all_gathers = Records(trace, "all_gather");
  ASSERT_FALSE(all_gathers.empty()) << trace.str();
  for (size_t r : all_gathers) {
    EXPECT_TRUE(WaitedBy(trace, r, "current")) << "all-gather e" << trace.ops()[r].event
                                               << " never waited for by the copy-out\n"
                                               << trace.str();
    bool after_copy_in = false;
    for (size_t i = r; i-- > 0;) {
      const StreamOp& op = trace.ops()[i];
      if (Is(op, Kind::kRecord, "all_gather")) break;
      after_copy_in = after_copy_in || (Is(op, Kind::kWaitStream, "all_gather") &&
                                        op.other == "all_gather_copy_in");
    }
    EXPECT_TRUE(after_copy_in) << "all-gather e" << trace.ops()[r].event
                               << " not ordered after its copy-in\n" << trace.str();
  }
  int copy_in_waits = 0;
  for (const StreamOp& op : trace.ops()) {
    if (Is(op, Kind::kWaitStream, "all_gather_copy_in") && op.other == "current") ++copy_in_waits;
  }
  EXPECT_EQ(copy_in_waits, allowed_copy_in_waits)
      << "the copy-in stream must run ahead of compute\n" << trace.str();
}

// The copy-out events: the first event the current stream records after a copy-out's work
// (other current-stream records are reshard events).
std::vector<size_t> CopyOutRecords(const fsdp2::StreamTrace& trace) {
  std::vector<size_t> out;
  const std::vector<StreamOp>& ops = trace.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Kind::kWork || ops[i].other != "all_gather_copy_out") continue;
    for (size_t j = i + 1; j < ops.size(); ++j) {
      if (Is(ops[j], Kind::kRecord, "current")) {
        out.push_back(j);
        break;
      }
    }
  }
  return out;
}

// Every copy-out event is waited for by both all-gather streams before the trace ends: the
// all-gather buffer it read is released only then.
void ExpectCopyOutsReleasedSafely(const fsdp2::StreamTrace& trace) {
  const std::vector<size_t> copy_outs = CopyOutRecords(trace);
  EXPECT_EQ(copy_outs.size(), Records(trace, "all_gather").size()) << trace.str();
  for (size_t r : copy_outs) {
    for (const char* stream : {"all_gather_copy_in", "all_gather"}) {
      EXPECT_TRUE(WaitedBy(trace, r, stream))
          << stream << " never waits for copy-out e" << trace.ops()[r].event << "\n"
          << trace.str();
    }
  }
}

class FsdpStreamContract : public ::testing::TestWithParam<ReshardAfterForward> {};

TEST_P(FsdpStreamContract, ForwardAllGathersRunAheadAndBuffersAreReleasedAfterTheirCopyOut) {
  for (const Traces& t : TraceRanks(GetParam())) {
    ExpectGuardsBalanced(t.forward);
    // The root pre-forward orders both all-gather streams after the optimizer step first.
    ASSERT_GE(t.forward.ops().size(), 2u);
    EXPECT_EQ(t.forward.ops()[0].str(), "all_gather_copy_in.wait_stream(current)");
    EXPECT_EQ(t.forward.ops()[1].str(), "all_gather.wait_stream(current)");
    ExpectAllGatherContract(t.forward, /*allowed_copy_in_waits=*/1);
    ExpectCopyOutsReleasedSafely(t.forward);
  }
}

TEST_P(FsdpStreamContract, BackwardReductionsAreWaitedForBeforeTheOptimizer) {
  for (const Traces& t : TraceRanks(GetParam())) {
    const fsdp2::StreamTrace& bwd = t.backward;
    ExpectGuardsBalanced(bwd);
    // Each reduce-scatter starts after the gradients produced on the current stream.
    const std::vector<StreamOp>& ops = bwd.ops();
    int reductions = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!Is(ops[i], Kind::kEnterGuard, "reduce_scatter")) continue;
      ++reductions;
      ASSERT_GT(i, 0u);
      EXPECT_EQ(ops[i - 1].str(), "reduce_scatter.wait_stream(current)") << bwd.str();
    }
    EXPECT_EQ(reductions, 4) << bwd.str();  // 3 blocks + the root's own parameters
    // Nothing produced on the reduce-scatter stream is left unwaited by the current stream
    // (the reduce-scatter input's event and every post-reduce event) when backward returns.
    const std::vector<size_t> records = Records(bwd, "reduce_scatter");
    EXPECT_EQ(records.size(), 8u) << bwd.str();
    for (size_t r : records) {
      EXPECT_TRUE(WaitedBy(bwd, r, "current"))
          << "e" << ops[r].event << " on the reduce-scatter stream is never waited for\n"
          << bwd.str();
    }
    // Backward all-gathers (re-unsharding resharded blocks) follow the same contract, and
    // their copy-outs release the buffer at once.
    if (GetParam() != ReshardAfterForward(false)) {
      ExpectAllGatherContract(bwd, /*allowed_copy_in_waits=*/0);
      ExpectCopyOutsReleasedSafely(bwd);
    }
  }
}

TEST_P(FsdpStreamContract, PostForwardMeshShardsAreOrderedBeforeTheirAllGather) {
  if (GetParam() != ReshardAfterForward(2)) GTEST_SKIP() << "only an int reshards to a mesh";
  for (const Traces& t : TraceRanks(GetParam())) {
    // Each post-forward reshard records an event on the current stream in forward...
    std::set<int64_t> forward_records;
    for (size_t r : Records(t.forward, "current")) forward_records.insert(t.forward.ops()[r].event);
    // ...and backward's all-gather streams wait for events recorded in forward before the
    // all-gathers that read those shards.
    int waited = 0;
    for (const StreamOp& op : t.backward.ops()) {
      if (op.kind == Kind::kWaitEvent && op.stream == "all_gather_copy_in" &&
          forward_records.count(op.event) != 0) {
        ++waited;
      }
    }
    EXPECT_EQ(waited, 3) << t.backward.str();  // the 3 resharded blocks
  }
}

INSTANTIATE_TEST_SUITE_P(ReshardAfterForward, FsdpStreamContract,
                         ::testing::Values(ReshardAfterForward(true), ReshardAfterForward(false),
                                           ReshardAfterForward(2)));

TEST(FsdpStreamContractPostOptimEvent, RootPreForwardWaitsForTheEventOnlyOnce) {
  for (const Traces& t : TraceRanks(ReshardAfterForward(true), /*post_optim_event=*/true)) {
    const std::vector<StreamOp>& ops = t.second_forward.ops();
    ASSERT_GE(ops.size(), 2u);
    const std::string id = "e" + std::to_string(t.post_optim_event);
    EXPECT_EQ(ops[0].str(), "all_gather_copy_in.wait_event(" + id + ")");
    EXPECT_EQ(ops[1].str(), "all_gather.wait_event(" + id + ")");
    // Instead of, not in addition to, waiting for the whole current stream.
    ExpectAllGatherContract(t.second_forward, /*allowed_copy_in_waits=*/0);
  }
}

}  // namespace
}  // namespace fsdp::fakes
