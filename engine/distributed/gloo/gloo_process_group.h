// GlooProcessGroup: ProcessGroup over Gloo's TCP transport (CPU tensors; CUDA tensors are
// staged through host memory). Ranks are processes (FileStore or TcpStore rendezvous) or
// threads of one process (in-process store), one Gloo context per group.
//
//   auto store = std::make_shared<distributed::FileStore>(dir);  // or HashStore, TcpStore
//   auto pg = distributed::GlooProcessGroup::Create(store, rank, world_size, options);
//   pg->all_reduce(t);
//
// Algorithms: allreduce, allgather, allgatherv (allgather_ with per-rank sizes), broadcast and
// barrier are Gloo's options-API collectives; reduce-scatter is a pipelined ring on
// UnboundBuffer send/recv (gloo_reduce_scatter.h; this Gloo's only reduce-scatter,
// ReduceScatterHalvingDoubling, pins the TCP send buffer to the kernel minimum and ruins later
// bandwidth; see docs/process_groups.md).
// float16/bfloat16 reductions accumulate in float32 and round once; AVG divides the sum by the
// group size; PREMUL_SUM scales each rank's input before the sum. Results are identical on
// every rank but, unlike the threaded fake, not accumulated in rank order.
//
// Failures: a Gloo timeout becomes Error(kDeadlineExceeded), any other transport error
// Error(kUnavailable), both naming the call (op, group, sequence number, shapes, world size)
// and this rank's last collectives; the group is then unusable (kFailedPrecondition), as a
// Gloo context cannot recover from a half-finished collective. With
// GlooOptions::check_collectives every collective first all-gathers a fingerprint of the call
// (like TORCH_DISTRIBUTED_DEBUG=DETAIL) and a mismatch fails every rank with kDataLoss
// showing both sides. With GlooOptions::straggler_timeout every collective first waits, through
// the store, for every member to arrive, and names the ranks that did not within that time
// (rank, collective, sequence number, their last collective) on every waiting rank, instead of
// an anonymous timeout at the collective's deadline; and a CollectiveWatchdog thread names a
// member that hangs inside a collective every member reached (its heartbeat stopped for the
// stale window once the collective has been in flight for the straggler timeout), aborting the
// context (gloo_abort.h) so that every rank fails with kDeadlineExceeded naming it instead of
// waiting out the deadline.
//
// Signals: creating a group ignores SIGPIPE when it is at its default disposition (as Python
// does for PyTorch's ranks), so that a peer that closed its connections fails the collective
// instead of killing this process.
//
// Subgroups: new_group(ranks) connects a new context among the members through the store
// under the key prefix "<prefix>/pg<name>"; non-members return nullptr without communicating.
// Group names follow the threaded fake: "0" is the world, its subgroups "1", "2", ... in
// creation order, nested ones "1.1".
//
// Ownership: groups share the store and the rank's TCP device (shared_ptr).
// Thread-safety: a group is used by its rank's thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/process_group.h"
#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

struct GlooOptions {
  // Deadline of every collective and of rendezvous. Default: 30 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Address the rank's TCP device binds and advertises. Default: "127.0.0.1" (one host).
  std::string hostname = "127.0.0.1";
  // Network interface to bind instead of `hostname` (e.g. "eth0"). Default: "" (unused).
  std::string iface;
  // All-gather and compare a fingerprint before every collective. Default: false.
  bool check_collectives = false;
  // How long a rank waits for every member to reach a collective before failing with
  // kDeadlineExceeded naming the ranks that did not (StragglerMonitor, through the store), and
  // how long a collective every member reached may be in flight before the watchdog looks for
  // members that stopped responding inside it (CollectiveWatchdog); 0 turns both off.
  // Default: 0 (off).
  std::chrono::milliseconds straggler_timeout{0};
  // Store key prefix, to host several worlds in one store. Default: "".
  std::string prefix;
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  // The world group of `world_size` ranks; collective over the ranks (rendezvous through
  // `store`). Throws kDeadlineExceeded when not every rank shows up within options.timeout.
  static std::shared_ptr<GlooProcessGroup> Create(std::shared_ptr<Store> store, int rank,
                                                  int world_size, GlooOptions options = {});
  ~GlooProcessGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "gloo"; }
  std::vector<int> global_ranks() const override;
  std::chrono::milliseconds timeout() const override;
  std::string group_name() const override;

  struct State;  // Gloo context, device and bookkeeping (gloo_process_group.cc)

 protected:
  std::shared_ptr<Work> all_gather_into_tensor_impl(const Tensor& output, const Tensor& input,
                                                    const CollectiveInfo& info) override;
  std::shared_ptr<Work> reduce_scatter_tensor_impl(const Tensor& output, const Tensor& input,
                                                   const ReduceOptions& options,
                                                   const CollectiveInfo& info) override;
  std::shared_ptr<Work> all_reduce_impl(const Tensor& tensor, const ReduceOptions& options,
                                        const CollectiveInfo& info) override;
  std::shared_ptr<Work> broadcast_impl(const Tensor& tensor, int root,
                                       const CollectiveInfo& info) override;
  std::shared_ptr<Work> all_gather_impl(const std::vector<Tensor>& outputs, const Tensor& input,
                                        const CollectiveInfo& info) override;
  void barrier_impl(const CollectiveInfo& info) override;
  std::shared_ptr<ProcessGroup> new_group_impl(const std::vector<int>& ranks,
                                               const CollectiveInfo& info) override;

 private:
  explicit GlooProcessGroup(std::unique_ptr<State> state);
  template <typename Fn>
  void Guarded(const CollectiveInfo& info, Fn&& fn);
  void CheckFingerprint(const CollectiveInfo& info);
  std::shared_ptr<Work> Done(const CollectiveInfo& info) const;

  std::unique_ptr<State> state_;
};

}  // namespace fsdp::distributed
