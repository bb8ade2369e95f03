#include "engine/distributed/gloo/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <signal.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "engine/core/rank_context.h"
#include "engine/distributed/collective_watchdog.h"
#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/gloo/gloo_abort.h"
#include "engine/distributed/gloo/gloo_reduce_scatter.h"
#include "engine/distributed/store/prefix_store.h"
#include "engine/distributed/straggler_monitor.h"
#include "engine/distributed/host_staging.h"

namespace fsdp::distributed {

namespace {

// Gloo's view of a rendezvous Store: waits (and the wait before every read, which Gloo's
// rendezvous expects of get) use the group's timeout instead of Gloo's own 30 s.
class GlooRendezvousStore final : public ::gloo::rendezvous::Store {
 public:
  GlooRendezvousStore(std::shared_ptr<distributed::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<distributed::Store> store_;
  std::chrono::milliseconds timeout_;
};

// Gloo's TCP transport writes with writev(2), which raises SIGPIPE when the peer has closed its
// end (it stopped, or aborted the group): a rank at SIGPIPE's default disposition would die of
// it instead of failing the collective with "Connection closed by peer". Python ignores SIGPIPE
// for every PyTorch rank; a process that creates a Gloo group does the same here, unless it
// installed a disposition of its own.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

bool LooksLikeTimeout(const std::string& what) {
  std::string lower = what;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

// Runs `fn`, turning Gloo and store exceptions into fsdp::Error with `context` prepended.
template <typename Fn>
auto TranslateGlooErrors(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const ::gloo::IoException& e) {
    FSDP_THROW(LooksLikeTimeout(e.what()) ? ErrorCode::kDeadlineExceeded : ErrorCode::kUnavailable,
               context, ": gloo I/O error: ", e.what());
  } catch (const ::gloo::Exception& e) {
    FSDP_THROW(LooksLikeTimeout(e.what()) ? ErrorCode::kDeadlineExceeded : ErrorCode::kInternal,
               context, ": gloo error: ", e.what());
  } catch (const std::exception& e) {
    FSDP_THROW(LooksLikeTimeout(e.what()) ? ErrorCode::kDeadlineExceeded : ErrorCode::kInternal,
               context, ": ", e.what());
  }
}

}  // namespace

// ---- State --------------------------------------------------------------------------------

// Tag of the barrier that ends a group's rendezvous; collectives use 2 * sequence (+ 1), which
// never reaches it.
constexpr uint32_t kConnectBarrierTag = 0xFFFFFFFFu;

struct GlooProcessGroup::State {
  std::shared_ptr<Store> store;
  std::unique_ptr<GlooRendezvousStore> rendezvous_store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  GlooOptions options;
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks;
  std::string name;
  int subgroups_created = 0;
  std::string broken;  // why the group is unusable; empty while healthy
  std::unique_ptr<StragglerMonitor> stragglers;  // set when options.straggler_timeout > 0
  // Reduce-scatter's ring buffers, kept across calls (gloo_reduce_scatter.h); made on first use.
  std::unique_ptr<RingReduceScatterWorkspace> reduce_scatter_workspace;
  // Names a member hanging inside a collective and aborts the context (set with stragglers).
  // Declared last: destroyed (its thread joined) before the context it aborts.
  std::unique_ptr<CollectiveWatchdog> watchdog;

  std::string Describe() const {
    std::ostringstream os;
    os << "gloo group " << name << " (rank " << rank << "/" << size << ", global rank "
       << global_ranks[static_cast<size_t>(rank)] << ", timeout " << options.timeout.count()
       << " ms)";
    return os.str();
  }

  // Rendezvous of this group's members under "<prefix>/pg<name>".
  void Connect() {
    rendezvous_store = std::make_unique<GlooRendezvousStore>(
        std::make_shared<PrefixStore>(options.prefix + "/pg" + name, store), options.timeout);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(options.timeout);
    TranslateGlooErrors("rendezvous of " + Describe(), [&] {
      try {
        ctx->connectFullMesh(*rendezvous_store, device);
      } catch (const Error& e) {  // the store's own error (a peer never came): say who waited
        FSDP_THROW(e.code(), "rendezvous of ", Describe(), ": ", e.message());
      }
    });
    // No member returns before every member finished its side of the mesh: a rank that exits
    // right after rendezvous (a case that issues no collective) would otherwise close pairs a
    // slower peer is still connecting ("Connection closed by peer"). c10d ends
    // init_process_group with a store-based barrier for the same reason.
    TranslateGlooErrors("connect barrier of " + Describe(), [&] {
      ::gloo::BarrierOptions o(ctx);
      o.setTag(kConnectBarrierTag);
      o.setTimeout(options.timeout);
      ::gloo::barrier(o);
    });
    context = std::move(ctx);
    if (options.straggler_timeout.count() > 0) {
      stragglers = std::make_unique<StragglerMonitor>(
          std::make_shared<PrefixStore>(options.prefix + "/pg" + name + "/stragglers", store),
          rank, global_ranks, options.straggler_timeout);
      watchdog = std::make_unique<CollectiveWatchdog>(
          std::make_shared<PrefixStore>(options.prefix + "/pg" + name + "/watchdog", store),
          rank, global_ranks, options.straggler_timeout,
          [ctx = context](const std::string& report) { AbortGlooContext(*ctx, report); });
    }
  }

  // A transfer of `info` failed: when it failed because a member hangs inside it (this rank's
  // watchdog aborted the context, or a peer's closed its connections), throws that report
  // (kDeadlineExceeded) with this rank's last collectives and makes the group unusable.
  void ThrowIfAMemberHangs(const CollectiveInfo& info) {
    if (!watchdog) return;
    const std::optional<std::string> hang = watchdog->HangReport(info.sequence_number);
    if (!hang) return;
    broken = info.str() + ": a member hangs inside it: " + hang->substr(0, hang->find('\n'));
    FSDP_THROW(ErrorCode::kDeadlineExceeded, "[", info.str(), "] ", Describe(), ": ", *hang,
               "\n  this rank's last collectives:\n", CurrentFlightRecorder().Dump(4, "    "));
  }

  // Waits for every member to reach `info` (when the straggler check is on); a rank that does
  // not makes the group unusable, as a timeout inside the collective would.
  void AwaitMembers(const CollectiveInfo& info) {
    if (!stragglers) return;
    try {
      stragglers->Arrive(info);
    } catch (const Error& e) {
      broken = "straggler check failed: " + e.message().substr(0, e.message().find('\n'));
      throw;
    }
  }
};

std::shared_ptr<GlooProcessGroup> GlooProcessGroup::Create(std::shared_ptr<Store> store,
                                                           int rank, int world_size,
                                                           GlooOptions options) {
  FSDP_CHECK(store != nullptr, "GlooProcessGroup::Create: null store");
  FSDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "GlooProcessGroup::Create: rank ",
             rank, " out of range for world size ", world_size);
  FSDP_CHECK(options.timeout.count() > 0, "GlooProcessGroup::Create: timeout must be positive");
  IgnoreSigpipeUnlessHandled();
  auto state = std::make_unique<State>();
  state->store = std::move(store);
  state->options = std::move(options);
  state->rank = rank;
  state->size = world_size;
  state->global_ranks.resize(static_cast<size_t>(world_size));
  std::iota(state->global_ranks.begin(), state->global_ranks.end(), 0);
  state->name = "0";
  ::gloo::transport::tcp::attr attr;
  if (!state->options.iface.empty()) {
    attr.iface = state->options.iface;
  } else {
    attr.hostname = state->options.hostname;
  }
  attr.ai_family = AF_INET;
  state->device =
      TranslateGlooErrors("creating the gloo TCP device for rank " + std::to_string(rank),
                          [&] { return ::gloo::transport::tcp::CreateDevice(attr); });
  state->Connect();
  return std::shared_ptr<GlooProcessGroup>(new GlooProcessGroup(std::move(state)));
}

GlooProcessGroup::GlooProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
GlooProcessGroup::~GlooProcessGroup() {
  if (state_->stragglers) state_->stragglers->Leave();
}

int GlooProcessGroup::rank() const { return state_->rank; }
int GlooProcessGroup::size() const { return state_->size; }
std::vector<int> GlooProcessGroup::global_ranks() const { return state_->global_ranks; }
std::chrono::milliseconds GlooProcessGroup::timeout() const { return state_->options.timeout; }
std::string GlooProcessGroup::group_name() const { return state_->name; }

std::shared_ptr<Work> GlooProcessGroup::Done(const CollectiveInfo& info) const {
  return std::make_shared<CompletedWork>(info.str(), timeout());
}

namespace {

// Gloo tags are 32 bits; the op uses an odd tag and its fingerprint check the even one below.
uint32_t OpTag(const CollectiveInfo& info) {
  return static_cast<uint32_t>(info.sequence_number * 2 + 1);
}
uint32_t CheckTag(const CollectiveInfo& info) {
  return static_cast<uint32_t>(info.sequence_number * 2);
}

}  // namespace

template <typename Fn>
void GlooProcessGroup::Guarded(const CollectiveInfo& info, Fn&& fn) {
  State& s = *state_;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, s.broken.empty(), "[", info.str(), "] ",
                  s.Describe(), " is unusable after an earlier failure: ", s.broken);
  try {
    s.AwaitMembers(info);
  } catch (const Error& e) {
    FSDP_THROW(e.code(), e.message(), "\n  this rank's last collectives:\n",
               CurrentFlightRecorder().Dump(4, "    "));
  }
  // Every member reached the collective: from here a member that hangs is the watchdog's.
  struct InFlight {  // the watchdog's bracket around the fingerprint exchange and the op
    CollectiveWatchdog* watchdog;
    ~InFlight() {
      if (watchdog != nullptr) watchdog->Finished();
    }
  } in_flight{s.watchdog.get()};
  if (s.watchdog) s.watchdog->Started(info);
  try {
    if (s.options.check_collectives) CheckFingerprint(info);
  } catch (const Error&) {
    s.ThrowIfAMemberHangs(info);
    throw;
  }
  try {
    TranslateGlooErrors(
        "[" + info.str() + "] " + s.Describe() + ", world size " + std::to_string(s.size),
        std::forward<Fn>(fn));
  } catch (const Error& e) {
    s.ThrowIfAMemberHangs(info);
    s.broken = info.str() + ": " + e.message().substr(0, e.message().find('\n'));
    FSDP_THROW(e.code(), e.message(), "\n  this rank's last collectives:\n",
               CurrentFlightRecorder().Dump(4, "    "));
  }
  // The watchdog aborted the context just as the collective completed: the next one fails.
  if (auto report = s.watchdog ? s.watchdog->aborted() : std::nullopt) {
    s.broken = "the collective watchdog aborted the group: " + report->substr(0, report->find('\n'));
  }
}

void GlooProcessGroup::CheckFingerprint(const CollectiveInfo& info) {
  State& s = *state_;
  const std::vector<int64_t> mine = EncodeFingerprint(info);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(s.size));
  try {
    TranslateGlooErrors("[" + info.str() + "] fingerprint exchange on " + s.Describe(), [&] {
      ::gloo::AllgatherOptions o(s.context);
      o.setInput(const_cast<int64_t*>(mine.data()), mine.size());
      o.setOutput(all.data(), all.size());
      o.setTag(CheckTag(info));
      o.setTimeout(s.options.timeout);
      ::gloo::allgather(o);
    });
  } catch (const Error& e) {
    s.broken = "fingerprint exchange failed: " + e.message().substr(0, e.message().find('\n'));
    throw;
  }
  std::ostringstream diffs;
  int differing = 0;
  for (int r = 1; r < s.size; ++r) {
    const std::string diff =
        EncodedFingerprintMismatch(all.data(), all.data() + static_cast<size_t>(r) * mine.size());
    if (diff.empty()) continue;
    ++differing;
    diffs << "\n  rank " << r << ": " << diff;
  }
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, differing == 0, "[", info.str(),
                  "] collective mismatch on ", s.Describe(), ": ", differing,
                  " rank(s) issued a different collective than rank 0\n  rank 0 issued: ",
                  EncodedFingerprintStr(all.data()), diffs.str());
}

namespace {

// The type reductions compute in: float for f32/f16/bf16, double for f64, int64 for i64.
template <typename Fn>
void DispatchCompute(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat64:
      fn(double{});
      return;
    case DType::kInt64:
      fn(int64_t{});
      return;
    default:
      fn(float{});
      return;
  }
}

bool Is16Bit(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

template <typename C>
::gloo::AllreduceOptions::Func ReduceFunction(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    C* out = static_cast<C*>(c);
    const C* x = static_cast<const C*>(a);
    const C* y = static_cast<const C*>(b);
    CombineElements<C>(op, out, x, y, n);
  };
}

// A host buffer of the compute type holding `n` elements of `src` (dtype `dtype`), scaled by
// `premul` when the op is PREMUL_SUM. Points at `src` itself when no copy is needed and
// `in_place_ok`.
template <typename C>
struct ComputeBuffer {
  std::vector<C> storage;
  C* data = nullptr;
};

template <typename C>
ComputeBuffer<C> MakeComputeBuffer(const char* src, DType dtype, size_t n, char* writable,
                                   const ReduceOptions& options) {
  ComputeBuffer<C> b;
  if (!Is16Bit(dtype) && writable != nullptr) {
    b.data = reinterpret_cast<C*>(writable);
    if (src != writable && n > 0) std::memcpy(writable, src, n * sizeof(C));
  } else {
    b.storage.resize(n);
    if (n > 0) ConvertElements(src, dtype, b.storage.data(), DTypeOf<C>::value, n);
    b.data = b.storage.data();
  }
  if (options.op == ReduceOp::kPremulSum) {
    const C factor = static_cast<C>(options.premul_factor);
    for (size_t i = 0; i < n; ++i) b.data[i] *= factor;
  }
  return b;
}

template <typename C>
void FinishAvg(const ReduceOptions& options, C* data, size_t n, int size) {
  if (options.op != ReduceOp::kAvg) return;
  const C divisor = static_cast<C>(size);
  for (size_t i = 0; i < n; ++i) data[i] /= divisor;
}

}  // namespace

std::shared_ptr<Work> GlooProcessGroup::all_gather_into_tensor_impl(const Tensor& output,
                                                                    const Tensor& input,
                                                                    const CollectiveInfo& info) {
  HostStaging stage;
  char* out = stage.Output(output, info.in_place);
  // Gloo copies the input into the output's chunk itself; an aliased input goes via a copy.
  std::vector<char> input_copy;
  const char* in = stage.Input(input);
  const size_t bytes = input.nbytes();
  if (info.in_place && bytes > 0) {
    const char* own = out + static_cast<size_t>(rank()) * bytes;
    input_copy.assign(own, own + bytes);
    in = input_copy.data();
  }
  Guarded(info, [&] {
    if (bytes == 0) return;
    ::gloo::AllgatherOptions o(state_->context);
    o.setInput(const_cast<char*>(in), bytes);
    o.setOutput(out, bytes * static_cast<size_t>(size()));
    o.setTag(OpTag(info));
    o.setTimeout(timeout());
    ::gloo::allgather(o);
  });
  stage.WriteBack();
  return Done(info);
}

std::shared_ptr<Work> GlooProcessGroup::reduce_scatter_tensor_impl(const Tensor& output,
                                                                   const Tensor& input,
                                                                   const ReduceOptions& options,
                                                                   const CollectiveInfo& info) {
  HostStaging stage;
  const char* in = stage.Input(input);
  const size_t chunk = static_cast<size_t>(output.numel());
  // The ring writes this rank's chunk straight into the output, even when the output is the
  // input's chunk rank(): that chunk is only read, segment by segment, right before the same
  // segment of the result is written ([Note: pipelined ring reduce-scatter]).
  char* out = chunk > 0 ? stage.Output(output, false) : nullptr;
  Guarded(info, [&] {
    if (chunk == 0) return;
    DispatchCompute(input.dtype(), [&](auto tag) {
      using C = decltype(tag);
      // The result is reduced in place when the output is in the compute type.
      std::unique_ptr<C[]> converted;
      C* mine = reinterpret_cast<C*>(out);
      if (output.dtype() != DTypeOf<C>::value) {
        converted.reset(new C[chunk]);
        mine = converted.get();
      }
      auto& workspace = state_->reduce_scatter_workspace;
      if (workspace == nullptr) {
        workspace = std::make_unique<RingReduceScatterWorkspace>(state_->context);
      }
      RingReduceScatter<C>(*workspace, in, input.dtype(), chunk, options, mine, OpTag(info),
                           timeout(), "[" + info.str() + "]");
      FinishAvg<C>(options, mine, chunk, size());
      if (converted != nullptr) {
        ConvertElements(mine, DTypeOf<C>::value, out, output.dtype(), chunk);
      }
    });
  });
  if (chunk > 0) stage.WriteBack();
  return Done(info);
}

std::shared_ptr<Work> GlooProcessGroup::all_reduce_impl(const Tensor& tensor,
                                                        const ReduceOptions& options,
                                                        const CollectiveInfo& info) {
  HostStaging stage;
  char* data = stage.Output(tensor, true);
  const size_t n = static_cast<size_t>(tensor.numel());
  Guarded(info, [&] {
    if (n == 0) return;
    DispatchCompute(tensor.dtype(), [&](auto tag) {
      using C = decltype(tag);
      auto work = MakeComputeBuffer<C>(data, tensor.dtype(), n, data, options);
      ::gloo::AllreduceOptions o(state_->context);
      o.setOutput(work.data, n);
      o.setReduceFunction(ReduceFunction<C>(options.op));
      o.setTag(OpTag(info));
      o.setTimeout(timeout());
      ::gloo::allreduce(o);
      FinishAvg<C>(options, work.data, n, size());
      if (!work.storage.empty()) {
        ConvertElements(work.data, DTypeOf<C>::value, data, tensor.dtype(), n);
      }
    });
  });
  stage.WriteBack();
  return Done(info);
}

std::shared_ptr<Work> GlooProcessGroup::broadcast_impl(const Tensor& tensor, int root,
                                                       const CollectiveInfo& info) {
  HostStaging stage;
  char* data = stage.Output(tensor, rank() == root);
  const size_t bytes = tensor.nbytes();
  Guarded(info, [&] {
    if (bytes == 0) return;
    ::gloo::BroadcastOptions o(state_->context);
    o.setOutput(data, bytes);
    o.setRoot(root);
    o.setTag(OpTag(info));
    o.setTimeout(timeout());
    ::gloo::broadcast(o);
  });
  if (rank() != root) stage.WriteBack();
  return Done(info);
}

std::shared_ptr<Work> GlooProcessGroup::all_gather_impl(const std::vector<Tensor>& outputs,
                                                        const Tensor& input,
                                                        const CollectiveInfo& info) {
  HostStaging stage;
  std::vector<size_t> counts;  // bytes per rank
  size_t total = 0;
  for (const auto& out : outputs) {
    counts.push_back(out.nbytes());
    total += out.nbytes();
  }
  std::vector<char> gathered(total);
  std::vector<char> input_copy(input.nbytes());
  if (!input_copy.empty()) std::memcpy(input_copy.data(), stage.Input(input), input_copy.size());
  Guarded(info, [&] {
    if (total == 0) return;
    ::gloo::AllgathervOptions o(state_->context);
    o.setInput(input_copy.data(), input_copy.size());
    o.setOutput(gathered.data(), counts);
    o.setTag(OpTag(info));
    o.setTimeout(timeout());
    ::gloo::allgatherv(o);
  });
  size_t offset = 0;
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (counts[r] > 0) {
      std::memcpy(stage.Output(outputs[r], false), gathered.data() + offset, counts[r]);
    }
    offset += counts[r];
  }
  stage.WriteBack();
  return Done(info);
}

void GlooProcessGroup::barrier_impl(const CollectiveInfo& info) {
  Guarded(info, [&] {
    ::gloo::BarrierOptions o(state_->context);
    o.setTag(OpTag(info));
    o.setTimeout(timeout());
    ::gloo::barrier(o);
  });
}

std::shared_ptr<ProcessGroup> GlooProcessGroup::new_group_impl(const std::vector<int>& ranks,
                                                               const CollectiveInfo& info) {
  State& s = *state_;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, s.broken.empty(), "[", info.str(), "] ",
                  s.Describe(), " is unusable after an earlier failure: ", s.broken);
  s.AwaitMembers(info);
  if (s.options.check_collectives) CheckFingerprint(info);
  const std::string index = std::to_string(++s.subgroups_created);
  const std::string name = s.name == "0" ? index : s.name + "." + index;
  const int me = s.global_ranks[static_cast<size_t>(s.rank)];
  const auto it = std::find(ranks.begin(), ranks.end(), me);
  if (it == ranks.end()) return nullptr;
  auto sub = std::make_unique<State>();
  sub->store = s.store;
  sub->device = s.device;
  sub->options = s.options;
  sub->rank = static_cast<int>(it - ranks.begin());
  sub->size = static_cast<int>(ranks.size());
  sub->global_ranks = ranks;
  sub->name = name;
  sub->Connect();
  return std::shared_ptr<GlooProcessGroup>(new GlooProcessGroup(std::move(sub)));
}

}  // namespace fsdp::distributed
