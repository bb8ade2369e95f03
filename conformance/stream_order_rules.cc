#include "conformance/stream_order_rules.h"

#include <cstdint>
#include <optional>
#include <utility>

namespace fsdp::conformance {

namespace {

constexpr const char* kRecordedBeforeWaited = "events_recorded_before_waited";
constexpr const char* kGuardsBalanced = "stream_guards_balanced";
constexpr const char* kCopyInAfterOptimizer = "copy_in_after_optimizer_step";
constexpr const char* kCopyInAfterReshard = "copy_in_after_post_forward_reshard";
constexpr const char* kAllGatherAfterCopyIn = "all_gather_after_copy_in";
constexpr const char* kCopyOutAfterAllGather = "copy_out_after_all_gather";
constexpr const char* kAllGatherWaited = "all_gather_waited_before_release";
constexpr const char* kBufferReleased = "all_gather_buffer_released_after_copy_out";
constexpr const char* kReduceScatterAfterCopyIn = "reduce_scatter_after_copy_in";
constexpr const char* kAllReduceAfterReduceScatter = "all_reduce_after_reduce_scatter";
constexpr const char* kReduceScatterInputReleased =
    "reduce_scatter_input_released_after_reduce_scatter";
constexpr const char* kOptimizerAfterReduction = "optimizer_after_reduction";
constexpr const char* kDedicatedStreams = "communication_on_dedicated_streams";
constexpr const char* kRunAhead = "all_gather_streams_run_ahead";

constexpr const char* kCurrent = "current";
constexpr const char* kCopyInStream = "all_gather_copy_in";
constexpr const char* kAllGatherStream = "all_gather";

using Clock = std::map<std::string, int64_t>;

// A unit of work: its stream, its tick there, and where it was issued (for messages).
struct Node {
  std::string stream;
  int64_t tick = 0;
  std::string where;  // "#12 (unshard layers.0 FORWARD)"
};

// CUDA stream semantics over vector clocks (see the header).
class StreamClocks {
 public:
  Node Work(const std::string& stream, std::string where) {
    Clock& clock = streams_[stream];
    return {stream, ++clock[stream], std::move(where)};
  }
  void Record(const std::string& stream, int64_t event) { events_[event] = streams_[stream]; }
  bool WaitEvent(const std::string& stream, int64_t event) {
    auto it = events_.find(event);
    if (it == events_.end()) return false;
    Merge(streams_[stream], it->second);
    return true;
  }
  void WaitStream(const std::string& stream, const std::string& producer) {
    const Clock copy = streams_[producer];
    Merge(streams_[stream], copy);
  }
  // Whether work issued on `stream` from now on runs after `node`.
  bool Covers(const std::string& stream, const Node& node) {
    const Clock& clock = streams_[stream];
    auto it = clock.find(node.stream);
    return it != clock.end() && it->second >= node.tick;
  }
  int64_t Tick(const std::string& stream, const std::string& of) {
    const Clock& clock = streams_[stream];
    auto it = clock.find(of);
    return it == clock.end() ? 0 : it->second;
  }

 private:
  static void Merge(Clock& into, const Clock& from) {
    for (const auto& [stream, tick] : from) {
      int64_t& mine = into[stream];
      if (tick > mine) mine = tick;
    }
  }
  std::map<std::string, Clock> streams_;
  std::map<int64_t, Clock> events_;
};

struct AllGather {
  Node node;
  int64_t event = 0;  // its all_gather_event (0 until recorded)
};

std::string Str(const nlohmann::json& entry, const char* key) {
  auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : "";
}

class Judge {
 public:
  explicit Judge(const StreamOrderFacts& facts) : facts_(facts) {
    for (const std::string& rule : StreamOrderRuleNames()) violations_[rule];
  }

  void Run(const nlohmann::json& trace) {
    if (!trace.is_array()) {
      Violate(kRecordedBeforeWaited, "the stream trace is not a list");
      return;
    }
    for (size_t i = 0; i < trace.size(); ++i) Step(i, trace[i]);
    EndPass();
    if (!guards_.empty()) {
      Violate(kGuardsBalanced, "stream guard(s) never exited: innermost " + guards_.back());
    }
  }

  std::map<std::string, std::vector<std::string>> violations() && { return std::move(violations_); }

 private:
  void Violate(const char* rule, std::string what) { violations_[rule].push_back(std::move(what)); }

  void Step(size_t i, const nlohmann::json& e) {
    const std::string op = Str(e, "op");
    const std::string stream = Str(e, "stream");
    const std::string what = Str(e, "what");
    const int64_t event = e.value("event", int64_t{0});
    const std::string where = "#" + std::to_string(i) + " (" + Str(e, "fsdp_op") + ")";
    if (op == "phase") return Phase(what);
    if (op == "fsdp_event") return FsdpEvent(e, what, "#" + std::to_string(i));
    if (op == "record") {
      clocks_.Record(stream, event);
      if (awaiting_ && all_gathers_[*awaiting_].node.stream == stream) {
        all_gathers_[*awaiting_].event = event;
        awaiting_.reset();
      }
    } else if (op == "wait_event") {
      if (!clocks_.WaitEvent(stream, event)) {
        Violate(kRecordedBeforeWaited, stream + " waits for e" + std::to_string(event) + " at " +
                                           where + " before any record of it");
      }
    } else if (op == "wait_stream") {
      const std::string producer = Str(e, "other");
      if ((stream == kCopyInStream || stream == kAllGatherStream) && producer == kCurrent &&
          (!root_pre_forward_ || post_optim_event_pending_)) {
        Violate(kRunAhead, stream + " waits for the whole current stream at " + where +
                               (root_pre_forward_ ? " although a post-optimizer event was set"
                                                  : " outside the root pre-forward"));
      }
      clocks_.WaitStream(stream, producer);
    } else if (op == "enter_stream") {
      guards_.push_back(stream);
    } else if (op == "exit_stream") {
      if (guards_.empty() || guards_.back() != stream) {
        Violate(kGuardsBalanced, "exit of stream " + stream + " at " + where + " while " +
                                     (guards_.empty() ? "no guard" : guards_.back()) +
                                     " is the innermost guard");
      } else {
        guards_.pop_back();
      }
    } else if (op == "work") {
      Work(stream, what, event, where);
    } else {
      Violate(kRecordedBeforeWaited, "unknown entry op '" + op + "' at #" + std::to_string(i));
    }
  }

  void Phase(const std::string& phase) {
    EndPass();
    phase_ = phase;
    if (phase == "forward") {
      forward_begin_current_ = clocks_.Tick(kCurrent, kCurrent);
      root_pre_forward_ = true;
    } else if (phase == "optimizer_step") {
      // optimizer.step() reads the sharded gradients and writes the sharded parameters, on the
      // current stream.
      const Node step = clocks_.Work(kCurrent, "optimizer step");
      for (const Node& reduction : reductions_) {
        if (!clocks_.Covers(kCurrent, reduction)) {
          Violate(kOptimizerAfterReduction,
                  "the optimizer step is not ordered after the gradient reduction " +
                      reduction.where + " on " + reduction.stream);
        }
      }
      reductions_.clear();
      last_optimizer_step_ = step;
    } else if (phase == "set_post_optim_event") {
      post_optim_event_pending_ = true;
    }
  }

  // The end of a forward or backward: every all-gather buffer and reduce-scatter input of the
  // pass was released only after its consumer.
  void EndPass() {
    for (size_t i = pass_first_all_gather_; i < all_gathers_.size(); ++i) {
      if (!clocks_.Covers(kCurrent, all_gathers_[i].node)) {
        Violate(kAllGatherWaited, "the current stream is not ordered after all-gather " +
                                      all_gathers_[i].node.where + " when the " + phase_ +
                                      " ends");
      }
    }
    pass_first_all_gather_ = all_gathers_.size();
    for (const Node& copy_out : unreleased_copy_outs_) {
      for (const char* stream : {kCopyInStream, kAllGatherStream}) {
        if (!clocks_.Covers(stream, copy_out)) {
          Violate(kBufferReleased, std::string(stream) + " is not ordered after copy-out " +
                                       copy_out.where + " when the " + phase_ + " ends");
        }
      }
    }
    unreleased_copy_outs_.clear();
    if (phase_ == "backward") {
      for (const Node& reduce_scatter : unreleased_reduce_scatters_) {
        if (!clocks_.Covers(kCurrent, reduce_scatter)) {
          Violate(kReduceScatterInputReleased,
                  "the current stream is not ordered after reduce-scatter " +
                      reduce_scatter.where + " when backward ends");
        }
      }
      unreleased_reduce_scatters_.clear();
    }
  }

  void FsdpEvent(const nlohmann::json& e, const std::string& kind, const std::string& where) {
    const std::string module = Str(e, "module");
    const std::string state = Str(e, "state");
    if (kind == "unshard") {
      if (root_pre_forward_) {
        // The root pre-forward ran just before the first unshard of the forward.
        for (const char* stream : {kCopyInStream, kAllGatherStream}) {
          if (clocks_.Tick(stream, kCurrent) < forward_begin_current_) {
            Violate(kCopyInAfterOptimizer,
                    std::string(stream) + " is not ordered after the current stream's work "
                    "before the forward (the optimizer step) when the root pre-forward ends, " +
                    where);
          }
        }
        root_pre_forward_ = false;
        post_optim_event_pending_ = false;
      }
      unshard_module_ = module;
      unshard_state_ = state;
    } else if (kind == "reshard" && state == "FORWARD" &&
               facts_.post_forward_mesh_modules.count(module) != 0) {
      // The post-forward reshard copies the module's post-forward shards on the current stream.
      post_forward_reshards_[module] =
          clocks_.Work(kCurrent, where + " (post-forward reshard of '" + module + "')");
    }
  }

  void Work(const std::string& stream, const std::string& what, int64_t event,
            const std::string& where) {
    const Node node = clocks_.Work(stream, where);
    // An async_op unshard (set_unshard_async_op) issues its copy-in and all-gather on the
    // current stream in every state; a sync one on the all-gather streams in forward and
    // pre-backward (FSDPCommContext.get_all_gather_streams).
    const bool on_current = facts_.async_unshard_modules.count(unshard_module_) != 0;
    const bool dedicated =
        !on_current && (unshard_state_ == "FORWARD" || unshard_state_ == "PRE_BACKWARD");
    auto expect_stream = [&](const char* expected) {
      if (stream != expected) {
        Violate(kDedicatedStreams, what + " " + where + " runs on " + stream + ", not on " +
                                       expected);
      }
    };
    if (what == "all_gather_copy_in") {
      if (dedicated) expect_stream(kCopyInStream);
      if (on_current) expect_stream(kCurrent);
      if (last_optimizer_step_ && !clocks_.Covers(stream, *last_optimizer_step_)) {
        Violate(kCopyInAfterOptimizer,
                "all-gather copy-in " + where + " is not ordered after the optimizer step");
      }
      if (auto it = post_forward_reshards_.find(unshard_module_);
          it != post_forward_reshards_.end()) {
        if (!clocks_.Covers(stream, it->second)) {
          Violate(kCopyInAfterReshard, "all-gather copy-in " + where +
                                           " is not ordered after " + it->second.where);
        }
        post_forward_reshards_.erase(it);
      }
      copy_in_ = node;
    } else if (what == "all_gather") {
      if (dedicated) expect_stream(kAllGatherStream);
      if (on_current) expect_stream(kCurrent);
      if (!copy_in_ || !clocks_.Covers(stream, *copy_in_)) {
        Violate(kAllGatherAfterCopyIn,
                "all-gather " + where + " is not ordered after its copy-in" +
                    (copy_in_ ? " " + copy_in_->where : std::string(" (none issued)")));
      }
      copy_in_.reset();
      all_gathers_.push_back({node, 0});
      awaiting_ = all_gathers_.size() - 1;
    } else if (what == "all_gather_copy_out") {
      const AllGather* source = nullptr;
      for (const AllGather& ag : all_gathers_) {
        if (event != 0 && ag.event == event) source = &ag;
      }
      if (source == nullptr) {
        Violate(kCopyOutAfterAllGather, "copy-out " + where + " reads an all-gather whose event "
                                        "was never recorded");
      } else if (!clocks_.Covers(stream, source->node)) {
        Violate(kCopyOutAfterAllGather, "copy-out " + where + " is not ordered after its "
                                        "all-gather " + source->node.where);
      }
      // The previous all-gather results were released before this copy-out.
      for (const Node& earlier : unreleased_copy_outs_) {
        for (const char* s : {kCopyInStream, kAllGatherStream}) {
          if (!clocks_.Covers(s, earlier)) {
            Violate(kBufferReleased, std::string(s) + " is not ordered after copy-out " +
                                         earlier.where + " by the next copy-out " + where);
          }
        }
      }
      unreleased_copy_outs_.assign(1, node);
    } else if (what == "reduce_scatter_copy_in") {
      for (const Node& earlier : unreleased_reduce_scatters_) {
        if (!clocks_.Covers(kCurrent, earlier)) {
          Violate(kReduceScatterInputReleased,
                  "the current stream is not ordered after reduce-scatter " + earlier.where +
                      " by the next reduce-scatter copy-in " + where);
        }
      }
      unreleased_reduce_scatters_.clear();
      reduce_scatter_copy_in_ = node;
    } else if (what == "reduce_scatter") {
      expect_stream("reduce_scatter");
      if (!reduce_scatter_copy_in_ || !clocks_.Covers(stream, *reduce_scatter_copy_in_)) {
        Violate(kReduceScatterAfterCopyIn,
                "reduce-scatter " + where + " is not ordered after its copy-in" +
                    (reduce_scatter_copy_in_ ? " " + reduce_scatter_copy_in_->where
                                             : std::string(" (none issued)")));
      }
      reduce_scatter_copy_in_.reset();
      unreleased_reduce_scatters_.push_back(node);
      last_reduce_scatter_ = node;
    } else if (what == "all_reduce") {
      expect_stream("all_reduce");
      if (!last_reduce_scatter_ || !clocks_.Covers(stream, *last_reduce_scatter_)) {
        Violate(kAllReduceAfterReduceScatter,
                "all-reduce " + where + " is not ordered after its reduce-scatter" +
                    (last_reduce_scatter_ ? " " + last_reduce_scatter_->where
                                          : std::string(" (none issued)")));
      }
      last_reduce_scatter_.reset();
      reductions_.push_back(node);
    } else if (what == "post_reduce") {
      reductions_.push_back(node);
    }
  }

  const StreamOrderFacts& facts_;
  std::map<std::string, std::vector<std::string>> violations_;
  StreamClocks clocks_;
  std::vector<std::string> guards_;
  std::string phase_ = "start";
  int64_t forward_begin_current_ = 0;
  bool root_pre_forward_ = false;
  bool post_optim_event_pending_ = false;
  std::string unshard_module_;
  std::string unshard_state_;
  std::optional<Node> last_optimizer_step_;
  std::map<std::string, Node> post_forward_reshards_;
  std::optional<Node> copy_in_;
  std::vector<AllGather> all_gathers_;
  std::optional<size_t> awaiting_;
  size_t pass_first_all_gather_ = 0;  // all_gathers_ issued since the current pass began
  std::vector<Node> unreleased_copy_outs_;
  std::optional<Node> reduce_scatter_copy_in_;
  std::vector<Node> unreleased_reduce_scatters_;
  std::optional<Node> last_reduce_scatter_;
  std::vector<Node> reductions_;
};

}  // namespace

const std::vector<std::string>& StreamOrderRuleNames() {
  static const std::vector<std::string> names = {
      kRecordedBeforeWaited,   kGuardsBalanced,      kCopyInAfterOptimizer,
      kCopyInAfterReshard,     kAllGatherAfterCopyIn, kCopyOutAfterAllGather,
      kAllGatherWaited,        kBufferReleased,         kReduceScatterAfterCopyIn, kAllReduceAfterReduceScatter,
      kReduceScatterInputReleased, kOptimizerAfterReduction, kDedicatedStreams, kRunAhead};
  return names;
}

std::map<std::string, std::vector<std::string>> JudgeStreamOrder(const nlohmann::json& trace,
                                                                 const StreamOrderFacts& facts) {
  Judge judge(facts);
  judge.Run(trace);
  return std::move(judge).violations();
}

}  // namespace fsdp::conformance
