// Family `faults`: a collective that cannot complete must end in an error on
// EVERY rank, promptly, instead of a hang (the collective checker of
// fakes::ThreadedProcessGroup, PyTorch's ProcessGroupWrapper /
// TORCH_DISTRIBUTED_DEBUG=DETAIL and its threaded test harness):
//   mismatched_op    one rank issues another collective      -> every rank
//   fails, at once mismatched_size  one rank passes another element count   ->
//   every rank fails, at once missing_rank     one rank never joins: mode=sleep
//   (issues it after the deadline)
//                    -> every rank fails after the deadline, not before, naming
//                    it; mode=return (its function returns without it) -> the
//                    others fail at once, naming it
//   mismatched_root  one rank broadcasts from another root (same bytes) -> every rank
//                    fails, at once, naming both roots
//   throwing_rank    one rank throws before the collective   -> it reports its
//   own error, the
//                    others fail, at once
//   hung_rank        one rank's process stops (SIGSTOP) inside an all_reduce every
//                    rank reached, and is continued much later (process backends
//                    only) -> every other rank fails after the straggler timeout,
//                    not before, naming it; the continued rank fails at once
// The judges check that every rank fails and when, not the error's code or
// wording: PyTorch promises an exception, while the type and the text are each
// implementation's (the threaded fake's codes and reports are checked by
// fakes/collective_checker_test.cc).
//
// [Note: the fault world] The scenarios control the collective deadline
// (`deadline_ms`) and the ends of rank functions, which the launcher's own
// world does not let a scenario do (its deadline is 90% of the case's
// --timeout, and a rank whose body throws fails the case before the judge
// runs). So every case runs its collectives on a fresh fakes::ThreadedWorld
// with `deadline_ms` as its collective timeout, shared by the case's rank
// threads (FaultWorlds), and each rank runs the fault body the way a launcher
// runs a rank function (RunFaultRank): its context attached for reports,
// MarkRankReturned when the body returns, MarkRankFailed when it throws. The
// rank then REPORTS what happened (error code and message, steady-clock times)
// as observations, and the judge checks every rank's error and the time from
// the fault to it. On process backends (gloo), the mismatch scenarios run on
// the rank's own world group, whose collective checker the runner turns on
// (FSDP_CHECK_COLLECTIVES=1: a fingerprint all-gather before every collective);
// their deadline_ms does not apply there: a missing peer is named by the group's
// straggler check after the runner's straggler timeout (StragglerTimeoutOf the
// case's --timeout; RankEnv::straggler_timeout), which every rank reports as
// "deadline_ms" so that the judge reads the deadline that applied. throwing_rank
// (whose faulty rank ends its process on process backends) stays on the
// threaded fault world.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/process_group.h"
#include "fakes/threaded_process_group.h"

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Hands the rank threads of one case the same fault world ([Note: the fault world]). The
// world is keyed by the launcher's own ThreadedWorld of the case (the same object for all of
// its ranks); the first rank to ask creates it and the entry is dropped once every rank has
// its handle. A stale entry of an earlier case (whose launcher world has since been freed and
// its address reused) is recognised by its expired weak pointer and replaced.
// Thread-safety: fully synchronised (one mutex). Ownership: the ranks own the fault world
// through their handles; the registry holds it only until the last rank joined.
class FaultWorlds {
 public:
  static FaultWorlds& Instance() {
    static FaultWorlds* instance = new FaultWorlds();
    return *instance;
  }

  // Rank `rank`'s world group in the fault world of the case run by `launch_world`.
  std::shared_ptr<distributed::ProcessGroup> Join(fakes::ThreadedWorld& launch_world, int rank,
                                           std::chrono::milliseconds deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[&launch_world];
    const std::shared_ptr<fakes::ThreadedWorld> launch = launch_world.shared_from_this();
    if (entry.faults == nullptr || entry.launch.lock() != launch) {
      entry = Entry{launch, fakes::ThreadedWorld::Create(launch_world.world_size(), deadline), 0};
    }
    std::shared_ptr<distributed::ProcessGroup> group = entry.faults->CreateWorldGroup(rank);
    if (++entry.joined == launch_world.world_size()) entries_.erase(&launch_world);
    return group;
  }

 private:
  struct Entry {
    std::weak_ptr<fakes::ThreadedWorld> launch;
    std::shared_ptr<fakes::ThreadedWorld> faults;
    int joined = 0;
  };
  std::mutex mu_;
  std::map<const fakes::ThreadedWorld*, Entry> entries_;
};

// What a rank's fault body records; RunFaultRank adds the outcome.
struct Timeline {
  std::optional<int64_t> issued_ns;  // when this rank issued the faulty collective
  std::optional<int64_t> fault_ns;   // the faulty rank: when the fault happened
};

nlohmann::json OptionalNs(const std::optional<int64_t>& ns) {
  return ns ? nlohmann::json(*ns) : nlohmann::json(nullptr);
}

using FaultBody = std::function<void(distributed::ProcessGroup& pg, Timeline& timeline)>;

// The faulty rank of the case: `faulty_rank`, negative counting from the end.
int FaultyRank(const CaseParams& params, int world) {
  const int64_t given = params.GetInt("faulty_rank");
  const int64_t rank = given < 0 ? given + world : given;
  FSDP_CHECK(rank >= 0 && rank < world, "parameter faulty_rank=", given, " is not a rank of world ",
             world, " (use 0..", world - 1, " or -1..-", world, ")");
  return static_cast<int>(rank);
}

// Which world a fault scenario's collectives run on.
enum class FaultWorldKind {
  kFaultWorld,     // the threaded fault world with deadline_ms (threaded backend only)
  kAnyWorldGroup,  // the fault world on threaded; the rank's world group on process backends
};

// Runs `body` on a process backend's world group (its collective checker on) and returns the
// same observations as RunFaultRank.
nlohmann::json RunOnWorldGroup(RankEnv& env, const FaultBody& body) {
  Timeline timeline;
  nlohmann::json obs;
  obs["deadline_ms"] = env.straggler_timeout.count() > 0
                           ? nlohmann::json(env.straggler_timeout.count())
                           : nlohmann::json(nullptr);
  obs["error"] = nullptr;
  obs["error_ns"] = nullptr;
  try {
    body(*env.pg, timeline);
  } catch (const Error& e) {
    obs["error_ns"] = NowNs();
    obs["error"] = {{"code", ErrorCodeName(e.code())}, {"message", e.message()}};
  }
  obs["issued_ns"] = OptionalNs(timeline.issued_ns);
  obs["fault_ns"] = OptionalNs(timeline.fault_ns);
  return obs;
}

// Runs `body` as this rank's function in the case's fault world, as a launcher would, and
// returns the rank's observations: {"error": {code, message} | null, "issued_ns",
// "fault_ns", "error_ns"} (times: steady clock, ns; null when not applicable).
nlohmann::json RunFaultRank(RankEnv& env, const FaultBody& body,
                            FaultWorldKind kind = FaultWorldKind::kFaultWorld) {
  auto* launch = dynamic_cast<fakes::ThreadedProcessGroup*>(env.pg.get());
  if (launch == nullptr) {
    if (kind == FaultWorldKind::kAnyWorldGroup) return RunOnWorldGroup(env, body);
    SkipCase(
        "this fault scenario needs the threaded backend's fault world (its own "
        "deadline_ms); process backends run only the mismatch scenarios");
  }
  const auto deadline = std::chrono::milliseconds(env.params.GetInt("deadline_ms"));
  FSDP_CHECK(deadline.count() > 0, "parameter deadline_ms must be positive, got ",
             deadline.count());
  std::shared_ptr<distributed::ProcessGroup> pg =
      FaultWorlds::Instance().Join(launch->world(), env.rank, deadline);
  fakes::ThreadedWorld& world = static_cast<fakes::ThreadedProcessGroup&>(*pg).world();
  world.AttachRankContext(env.rank, &RankContext::Current());

  Timeline timeline;
  nlohmann::json obs;
  obs["deadline_ms"] = deadline.count();
  obs["error"] = nullptr;
  obs["error_ns"] = nullptr;
  try {
    body(*pg, timeline);
    world.MarkRankReturned(env.rank);
  } catch (const Error& e) {
    obs["error_ns"] = NowNs();
    obs["error"] = {{"code", ErrorCodeName(e.code())}, {"message", e.message()}};
    world.MarkRankFailed(env.rank, e.what());
  } catch (const std::exception& e) {
    world.MarkRankFailed(env.rank, e.what());  // peers fail at once; the case fails with it
    throw;
  }
  obs["issued_ns"] = OptionalNs(timeline.issued_ns);
  obs["fault_ns"] = OptionalNs(timeline.fault_ns);
  return obs;
}

// ---- Parameters -----------------------------------------------------------------------------

ParamSpec FaultyRankSize() {
  return ParamSpec::SizeInt("faulty_rank",
                            "the rank that misbehaves; negative counts from the end (-1: last)", -1,
                            /*minimum=*/std::nullopt);
}
ParamSpec DeadlineSize(int64_t ms) {
  return ParamSpec::SizeInt("deadline_ms", "collective timeout of the fault world", ms,
                            /*minimum=*/1);
}
ParamSpec MaxTimeToErrorSize() {
  return ParamSpec::SizeInt("max_time_to_error_ms",
                            "bound on the time from the fault to the error on any rank (for "
                            "missing_rank mode=sleep, on top of deadline_ms)",
                            500);
}
ParamSpec CountSize() { return ParamSpec::SizeInt("count", "elements of the all_reduce", 4); }
ParamSpec FaultDelaySize() {
  return ParamSpec::SizeInt("fault_delay_ms",
                            "how long the faulty rank waits before its fault, so that the "
                            "others are already blocked in the collective",
                            50);
}

// What every rank of a fault scenario reports (RunFaultRank).
ObservationSchema FaultSchema() {
  const nlohmann::json ns_or_null = {{"type", {"integer", "null"}}, {"minimum", 0}};
  ObservationSchema schema;
  schema
      .Add(ObservationKey::Custom(
          "error",
          {{"type", {"object", "null"}},
           {"required", {"code", "message"}},
           {"additionalProperties", false},
           {"properties", {{"code", {{"type", "string"}}}, {"message", {{"type", "string"}}}}}},
          "null when the rank's function returned; otherwise what the collective (or, on "
          "throwing_rank's faulty rank, the rank itself) raised: {\"code\": the error's kind (an "
          "ErrorCode name, or the Python exception type), \"message\": its text}"))
      .Add(ObservationKey::Custom(
          "deadline_ms", {{"type", {"integer", "null"}}, {"minimum", 1}},
          "how long the rank's group waits for a peer that does not reach a collective before "
          "failing: deadline_ms on the threaded fault world, the group's straggler timeout on a "
          "process backend (the runner's: 1% of the case's --timeout, 2 s to 10 s); null when "
          "the group has none"))
      .Add(ObservationKey::Custom(
          "error_ns", ns_or_null,
          "steady clock (CLOCK_MONOTONIC, ns) when the rank caught the error; null without one"))
      .Add(ObservationKey::Custom(
          "issued_ns", ns_or_null,
          "steady clock (ns) right before the rank issued the collective after the barrier: "
          "the all_reduce, or the faulty rank's faulty call (missing_rank mode=sleep: its late "
          "all_reduce); null when it issued none (missing_rank mode=return, throwing_rank's "
          "faulty rank)"))
      .Add(ObservationKey::Custom(
          "fault_ns", ns_or_null,
          "the faulty rank only: steady clock (ns) of its fault (its faulty call; for "
          "missing_rank when it starts to sleep or returns; for throwing_rank right before it "
          "raises; for hung_rank right before its process stops); null on the other ranks"));
  return schema;
}

ScenarioInfo FaultInfo(const std::string& name, const std::string& description,
                       const std::string& seed_test, std::vector<ParamSpec> params,
                       FaultWorldKind kind = FaultWorldKind::kFaultWorld) {
  ScenarioInfo info;
  info.observations = FaultSchema();
  info.name = "faults/" + name;
  info.description =
      description + (kind == FaultWorldKind::kFaultWorld
                         ? " (threaded backend only: runs on a fault world with deadline_ms "
                           "as "
                           "its collective timeout)"
                         : " (threaded: on a fault world with deadline_ms as its collective "
                           "timeout; process backends: on the world group, found by its "
                           "collective checker)");
  info.seed_test = seed_test;
  info.params = std::move(params);
  info.default_world = 4;
  info.min_world = 2;
  info.max_world = 128;
  info.requirements.in_process = kind == FaultWorldKind::kFaultWorld;
  // ctest: also the smallest world, world 128, and rank 0 as the faulty rank (the checker
  // compares every rank with rank 0). missing_rank sleeps through its deadline only at the
  // default world (MissingRank adds mode=return to these runs).
  info.test_runs = {{2, {}}, {128, {}}, {4, {{"faulty_rank", "0"}}}};
  return info;
}

// The collective every healthy rank issues second (after a barrier).
void IssueAllReduce(distributed::ProcessGroup& pg, int64_t count, Timeline& timeline) {
  Tensor t = Tensor::ones({count}, DType::kFloat32);
  timeline.issued_ns = NowNs();
  pg.all_reduce(t);
}

// ---- Judge helpers --------------------------------------------------------------------------

std::optional<int64_t> Ns(const std::vector<nlohmann::json>& per_rank, int rank,
                          const std::string& key) {
  const nlohmann::json& v = RankObservation(per_rank, rank, key);
  if (v.is_null()) return std::nullopt;
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, v.is_number_integer(), RankName(rank), ": ", key,
                  " must be an integer (ns) or null, got ", v.dump());
  return v.get<int64_t>();
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Checks `rank`'s error: `code`, and a message containing every one of `parts` (for errors the
// scenario raises itself). Returns false when the rank reported no error.
bool CheckError(CheckList& checks, const std::vector<nlohmann::json>& per_rank, int rank,
                const std::string& code, const std::vector<std::string>& parts) {
  const std::optional<std::string> message = CheckRankError(
      checks, per_rank, rank, code, "fails with " + code, "the rank reported no error");
  if (!message) return false;
  for (const std::string& part : parts) {
    checks.CheckTrue(RankName(rank) + " error names '" + part + "'",
                     message->find(part) != std::string::npos, *message);
  }
  return true;
}

// Records the time from the fault to every rank's error (`reference_ns(rank)`: when the error
// became due on that rank) against max_time_to_error_ms (+ `allowance_ms`), and the figures
// time_to_error_ms (the slowest rank) and min_time_to_error_ms.
void CheckTimes(CheckList& checks, const CaseParams& p, int world,
                const std::vector<nlohmann::json>& per_rank,
                const std::function<std::optional<int64_t>(int)>& reference_ns,
                double allowance_ms = 0) {
  const double bound = static_cast<double>(p.GetInt("max_time_to_error_ms")) + allowance_ms;
  double slowest = -1;
  double fastest = -1;
  for (int r = 0; r < world; ++r) {
    const std::optional<int64_t> error_ns = Ns(per_rank, r, "error_ns");
    const std::optional<int64_t> ref = reference_ns(r);
    if (!error_ns || !ref) continue;
    const double ms = Ms(*error_ns - *ref);
    checks.CheckTrue(RankName(r) + " time to error <= " + std::to_string(bound) + " ms",
                     ms <= bound, std::to_string(ms) + " ms");
    slowest = std::max(slowest, ms);
    fastest = fastest < 0 ? ms : std::min(fastest, ms);
  }
  if (slowest >= 0) {
    checks.SetFigure("time_to_error_ms", slowest);
    checks.SetFigure("min_time_to_error_ms", fastest);
  }
}

// The deadline that applied to the case, in ms (every rank reports its group's "deadline_ms";
// they agree): deadline_ms on the fault world, the straggler timeout on a process backend.
int64_t AppliedDeadlineMs(const std::vector<nlohmann::json>& per_rank) {
  const nlohmann::json& reported = RankObservation(per_rank, 0, "deadline_ms");
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, reported.is_number_integer(), RankName(0),
                  ": deadline_ms (the deadline that applied) must be an integer, got ",
                  reported.dump());
  return reported.get<int64_t>();
}

// The latest issued_ns over all ranks (when a mismatch became detectable).
std::optional<int64_t> LastIssued(const std::vector<nlohmann::json>& per_rank, int world) {
  std::optional<int64_t> last;
  for (int r = 0; r < world; ++r) {
    const auto ns = Ns(per_rank, r, "issued_ns");
    if (ns && (!last || *ns > *last)) last = ns;
  }
  return last;
}

// ---- Scenarios ------------------------------------------------------------------------------

// A mismatch: every rank fails, as soon as the last rank issued its collective, with an error
// that names the faulty rank (as PyTorch's ProcessGroupWrapper names the rank whose collective
// differs from rank 0's): a checker that reports another rank than the one that differs would
// send whoever debugs the hang to the wrong rank.
void JudgeMismatch(CheckList& checks, const CaseParams& p, int world,
                   const std::vector<nlohmann::json>& per_rank) {
  const int faulty = FaultyRank(p, world);
  for (int r = 0; r < world; ++r) {
    CheckRankFailed(checks, per_rank, r, "fails");
    const nlohmann::json& error = RankObservation(per_rank, r, "error");
    if (!error.is_object()) continue;
    const std::string message = error.value("message", "");
    checks.CheckTrue(RankName(r) + " error names the faulty rank " + std::to_string(faulty),
                     NamesRank(message, faulty), message);
  }
  const auto last = LastIssued(per_rank, world);
  CheckTimes(checks, p, world, per_rank, [&](int) { return last; });
}

// The body every mismatch scenario runs: after a barrier every healthy rank issues the float32
// SUM all_reduce of `count` elements (or `healthy_call` when given); the faulty rank waits
// fault_delay_ms (so that the others are already blocked), records the time, and issues
// `faulty_call` instead. On the fault world (threaded) or the rank's world group (process
// backends).
nlohmann::json RunMismatchRank(
    RankEnv& env, const std::function<void(distributed::ProcessGroup&)>& faulty_call,
    const std::function<void(distributed::ProcessGroup&)>& healthy_call = nullptr) {
  const int faulty = FaultyRank(env.params, env.world);
  const int64_t count = env.params.GetInt("count");
  const auto delay = std::chrono::milliseconds(env.params.GetInt("fault_delay_ms"));
  return RunFaultRank(
      env,
      [&](distributed::ProcessGroup& pg, Timeline& timeline) {
        pg.barrier();
        if (env.rank != faulty && !healthy_call) return IssueAllReduce(pg, count, timeline);
        if (env.rank != faulty) {
          timeline.issued_ns = NowNs();
          return healthy_call(pg);
        }
        std::this_thread::sleep_for(delay);
        timeline.issued_ns = timeline.fault_ns = NowNs();
        faulty_call(pg);
      },
      FaultWorldKind::kAnyWorldGroup);
}

Scenario MismatchedOp() {
  Scenario s;
  s.info = FaultInfo(
      "mismatched_op",
      "after a barrier every rank issues all_reduce but the faulty rank issues "
      "faulty_op: "
      "every rank fails, at once",
      "test_pg_wrapper.py::ProcessGroupGlooWrapperTest::test_collectives_op_"
      "mismatch_debug_mode",
      {ParamSpec::Axis("faulty_op", "what the faulty rank issues instead of all_reduce",
                       {"broadcast", "all_gather_into_tensor", "barrier"}),
       FaultyRankSize(), DeadlineSize(10000), MaxTimeToErrorSize(), CountSize(), FaultDelaySize()},
      FaultWorldKind::kAnyWorldGroup);
  s.run_rank = [](RankEnv& env) {
    const std::string faulty_op = env.params.GetString("faulty_op");
    const int64_t count = env.params.GetInt("count");
    return RunMismatchRank(env, [&](distributed::ProcessGroup& pg) {
      Tensor t = Tensor::ones({count}, DType::kFloat32);
      if (faulty_op == "broadcast") {
        pg.broadcast(t, 0);
      } else if (faulty_op == "all_gather_into_tensor") {
        Tensor out = Tensor::empty({count * pg.size()}, DType::kFloat32);
        pg.all_gather_into_tensor(out, t);
      } else {
        pg.barrier();
      }
    });
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) { JudgeMismatch(checks, p, world, per_rank); };
  return s;
}

Scenario MismatchedSize() {
  Scenario s;
  s.info =
      FaultInfo("mismatched_size",
                "after a barrier every rank issues all_reduce (or all_gather into a list) of "
                "count elements but the faulty rank passes count + extra: every rank fails, at "
                "once",
                "test_pg_wrapper.py::ProcessGroupGlooWrapperTest::test_collective_shape_"
                "mismatch_debug_mode",
                {ParamSpec::Axis("collective",
                                 "all_reduce; or all_gather into a list, where the faulty rank's "
                                 "input and its own entry of its output list hold count + extra "
                                 "elements (its list is consistent with its input, the others' "
                                 "lists with theirs)",
                                 {"all_reduce", "all_gather"}),
                 FaultyRankSize(), DeadlineSize(10000), MaxTimeToErrorSize(), CountSize(),
                 ParamSpec::SizeInt("extra", "elements the faulty rank adds", 1), FaultDelaySize()},
                FaultWorldKind::kAnyWorldGroup);
  s.run_rank = [](RankEnv& env) {
    const int64_t count = env.params.GetInt("count");
    const int64_t elements = count + env.params.GetInt("extra");
    if (env.params.GetString("collective") == "all_gather") {
      // Every rank's list: count elements per rank, but the faulty rank's own entry (its input).
      const int faulty = FaultyRank(env.params, env.world);
      auto gather = [faulty, count](distributed::ProcessGroup& pg, int64_t input_numel) {
        std::vector<Tensor> outputs;
        for (int r = 0; r < pg.size(); ++r) {
          const int64_t n = r == faulty && r == pg.rank() ? input_numel : count;
          outputs.push_back(Tensor::empty({n}, DType::kFloat32));
        }
        pg.all_gather(outputs, Tensor::ones({input_numel}, DType::kFloat32));
      };
      return RunMismatchRank(
          env, [&](distributed::ProcessGroup& pg) { gather(pg, elements); },
          [&](distributed::ProcessGroup& pg) { gather(pg, count); });
    }
    return RunMismatchRank(env, [&](distributed::ProcessGroup& pg) {
      Tensor t = Tensor::ones({elements}, DType::kFloat32);
      pg.all_reduce(t);
    });
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) { JudgeMismatch(checks, p, world, per_rank); };
  return s;
}

// The mismatches a byte-level transport cannot see: the faulty rank's all_reduce moves exactly
// the bytes the others' does, but as another dtype (float16, twice the elements) or with another
// reduce op (MAX). Without a fingerprint check every rank would return wrong data.
Scenario MismatchedDtypeOrReduceOp() {
  Scenario s;
  s.info = FaultInfo(
      "mismatched_dtype_or_reduce_op",
      "after a barrier every rank issues a float32 SUM all_reduce of count elements but the "
      "faulty rank issues, with the same byte count, a float16 all_reduce of 2*count elements "
      "(mismatch=dtype) or a MAX all_reduce (mismatch=reduce_op): every rank fails, at once",
      "the suite's own: test_pg_wrapper.py's mismatch tests with equal byte counts, which a "
      "transport cannot tell apart",
      {ParamSpec::Axis("mismatch", "what the faulty rank changes", {"dtype", "reduce_op"}),
       FaultyRankSize(), DeadlineSize(10000), MaxTimeToErrorSize(), CountSize(), FaultDelaySize()},
      FaultWorldKind::kAnyWorldGroup);
  s.run_rank = [](RankEnv& env) {
    const bool dtype = env.params.GetString("mismatch") == "dtype";
    const int64_t count = env.params.GetInt("count");
    return RunMismatchRank(env, [&](distributed::ProcessGroup& pg) {
      Tensor t = dtype ? Tensor::ones({2 * count}, DType::kFloat16)
                       : Tensor::ones({count}, DType::kFloat32);
      distributed::ReduceOptions options;
      if (!dtype) options.op = distributed::ReduceOp::kMax;
      pg.all_reduce(t, options);
    });
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) { JudgeMismatch(checks, p, world, per_rank); };
  // A default run whose faulty rank is neither rank 0 nor the last: a checker that compares
  // rank 0 with some ranks only (the last, or every rank from 2 on) misses it.
  s.info.extra_default_runs = {{4, {{"mismatch", "reduce_op"}, {"faulty_rank", "1"}}}};
  return s;
}

// The mismatch no byte count shows: every rank broadcasts the same float32 tensor, but the
// faulty rank names another root (the last rank instead of rank 0). Without a fingerprint check
// the ranks would each take another rank's data, or hang.
Scenario MismatchedRoot() {
  Scenario s;
  s.info = FaultInfo(
      "mismatched_root",
      "after a barrier every rank broadcasts count float32 elements from root 0 but the faulty "
      "rank names root world - 1 (or the reverse when it is rank 0): every rank fails, at once, "
      "with an error that names both roots",
      "the suite's own: test_pg_wrapper.py's mismatch tests, for the root argument",
      {FaultyRankSize(), DeadlineSize(10000), MaxTimeToErrorSize(), CountSize(), FaultDelaySize()},
      FaultWorldKind::kAnyWorldGroup);
  // The roots of a case: the healthy ranks' and the faulty rank's (never equal, world >= 2).
  static const auto roots = [](const CaseParams& p, int world) {
    const int faulty = FaultyRank(p, world);
    return faulty == world - 1 ? std::pair<int, int>{world - 1, 0}
                               : std::pair<int, int>{0, world - 1};
  };
  s.run_rank = [](RankEnv& env) {
    const int64_t count = env.params.GetInt("count");
    const auto [healthy_root, faulty_root] = roots(env.params, env.world);
    auto broadcast_from = [count](int root) {
      return [count, root](distributed::ProcessGroup& pg) {
        Tensor t = Tensor::ones({count}, DType::kFloat32);
        pg.broadcast(t, root);
      };
    };
    return RunMismatchRank(env, broadcast_from(faulty_root), broadcast_from(healthy_root));
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeMismatch(checks, p, world, per_rank);
    const auto [healthy_root, faulty_root] = roots(p, world);
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& error = RankObservation(per_rank, r, "error");
      const std::string message = error.is_object() ? error.value("message", "") : "";
      for (int root : {healthy_root, faulty_root}) {
        checks.CheckTrue(RankName(r) + " error names root " + std::to_string(root),
                         message.find("root " + std::to_string(root)) != std::string::npos ||
                             message.find("root=" + std::to_string(root)) != std::string::npos,
                         message);
      }
    }
  };
  return s;
}

// How long the rank's group waits for a missing peer: deadline_ms on the threaded fault world,
// the group's straggler timeout on a process backend (the case is skipped without one).
std::chrono::milliseconds MissingPeerDeadline(const RankEnv& env) {
  if (dynamic_cast<fakes::ThreadedProcessGroup*>(env.pg.get()) != nullptr) {
    return std::chrono::milliseconds(env.params.GetInt("deadline_ms"));
  }
  if (env.straggler_timeout.count() <= 0) {
    SkipCase(
        "the rank's group has no straggler timeout (FSDP_STRAGGLER_TIMEOUT_MS), so a missing "
        "rank would be found only at the collective's own deadline");
  }
  return env.straggler_timeout;
}

Scenario MissingRank() {
  Scenario s;
  s.info = FaultInfo(
      "missing_rank",
      "after a barrier every rank issues all_reduce but the faulty rank does not: mode=sleep "
      "(it issues it only after the deadline + late_by_ms): every rank fails after the "
      "deadline, not before, naming the faulty rank (the late rank at once when it issues it); "
      "mode=return (its function returns): the others fail at once, naming it. The deadline "
      "is deadline_ms on threaded and the group's straggler timeout on process backends",
      "test_pg_wrapper.py::ProcessGroupGlooWrapperTest::test_collective_hang",
      {ParamSpec::Axis("mode", "sleep past the deadline, or return without the collective",
                       {"sleep", "return"}),
       FaultyRankSize(), DeadlineSize(2000), MaxTimeToErrorSize(), CountSize(),
       ParamSpec::SizeInt("late_by_ms", "mode=sleep: how long after the deadline it issues it",
                          1000),
       FaultDelaySize(),
       ParamSpec::SizeBool("subgroup",
                           "the all_reduce runs on new_group(ranks 1..world-1), where group and "
                           "global ranks differ; rank 0 takes no part (needs world >= 3 and a "
                           "faulty rank other than 0)",
                           false)},
      FaultWorldKind::kAnyWorldGroup);
  for (TestRun& run : s.info.test_runs) run.params["mode"] = "return";
  // A returned member of a subgroup must be found by its global rank: with the faulty rank
  // last, its group rank is the global rank of a healthy member still waiting.
  s.info.extra_default_runs = {{4, {{"mode", "return"}, {"subgroup", "true"}}}};
  s.run_rank = [](RankEnv& env) {
    const int faulty = FaultyRank(env.params, env.world);
    const bool sleep = env.params.GetString("mode") == "sleep";
    const bool subgroup = env.params.GetBool("subgroup");
    FSDP_CHECK(!subgroup || (env.world >= 3 && faulty != 0),
               "subgroup=true needs world >= 3 and faulty_rank other than 0");
    const int64_t count = env.params.GetInt("count");
    const auto deadline = MissingPeerDeadline(env);
    const auto late_by = std::chrono::milliseconds(env.params.GetInt("late_by_ms"));
    const auto delay = std::chrono::milliseconds(env.params.GetInt("fault_delay_ms"));
    return RunFaultRank(
        env,
        [&](distributed::ProcessGroup& world_pg, Timeline& timeline) {
          std::shared_ptr<distributed::ProcessGroup> sub;
          if (subgroup) {
            std::vector<int> members;
            for (int r = 1; r < env.world; ++r) members.push_back(r);
            sub = world_pg.new_group(members);
            if (sub == nullptr) return;  // rank 0: not a member
          }
          distributed::ProcessGroup& pg = subgroup ? *sub : world_pg;
          pg.barrier();
          if (env.rank != faulty) return IssueAllReduce(pg, count, timeline);
          if (sleep) {
            timeline.fault_ns = NowNs();
            std::this_thread::sleep_for(deadline + late_by);
            IssueAllReduce(pg, count, timeline);
          } else {
            std::this_thread::sleep_for(delay);
            timeline.fault_ns = NowNs();  // returns: RunFaultRank marks it returned
          }
        },
        FaultWorldKind::kAnyWorldGroup);
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int faulty = FaultyRank(p, world);
    const bool sleep = p.GetString("mode") == "sleep";
    // subgroup=true: rank 0 takes no part and returns without error; the rest as on the world.
    const int first_member = p.GetBool("subgroup") ? 1 : 0;
    if (first_member == 1) {
      checks.CheckTrue(RankName(0) + " (not a member) reports no error",
                       RankObservation(per_rank, 0, "error").is_null(),
                       RankObservation(per_rank, 0, "error").dump());
    }
    for (int r = first_member; r < world; ++r) {
      const nlohmann::json& error = RankObservation(per_rank, r, "error");
      if (r == faulty || !error.is_object()) continue;
      const std::string message = error.value("message", "");
      checks.CheckTrue(RankName(r) + " error names the missing rank " + std::to_string(faulty),
                       NamesRank(message, faulty), message);
    }
    if (sleep) {
      const int64_t deadline = AppliedDeadlineMs(per_rank);
      // The checker fails the whole collective when the first waiter's deadline passes, so
      // the deadline counts from the first healthy rank's call.
      std::optional<int64_t> first_issue;
      for (int r = 0; r < world; ++r) {
        const auto ns = r == faulty ? std::nullopt : Ns(per_rank, r, "issued_ns");
        if (ns && (!first_issue || *ns < *first_issue)) first_issue = ns;
      }
      for (int r = first_member; r < world; ++r) {
        if (!CheckRankFailed(checks, per_rank, r, "fails")) continue;
        if (r == faulty || !first_issue) continue;
        const double waited = Ms(*Ns(per_rank, r, "error_ns") - *first_issue);
        checks.CheckTrue(RankName(r) + " fails no earlier than the deadline after the first call",
                         waited >= static_cast<double>(deadline), std::to_string(waited) + " ms");
      }
      // Healthy ranks: from the first call (the deadline allowed on top of the bound); the
      // late rank: checked below, from its own call.
      CheckTimes(
          checks, p, world, per_rank,
          [&](int r) { return r == faulty ? std::optional<int64_t>() : first_issue; },
          static_cast<double>(deadline));
      const auto late_issue = Ns(per_rank, faulty, "issued_ns");
      const auto late_error = Ns(per_rank, faulty, "error_ns");
      if (late_issue && late_error) {
        const double ms = Ms(*late_error - *late_issue);
        checks.CheckTrue(RankName(faulty) + " (late) fails at once when it issues the collective",
                         ms <= static_cast<double>(p.GetInt("max_time_to_error_ms")),
                         std::to_string(ms) + " ms");
      }
    } else {
      for (int r = first_member; r < world; ++r) {
        if (r == faulty) {
          checks.CheckTrue(RankName(r) + " (returned) reports no error",
                           RankObservation(per_rank, r, "error").is_null(),
                           RankObservation(per_rank, r, "error").dump());
          continue;
        }
        CheckRankFailed(checks, per_rank, r, "fails");
      }
      const auto fault = Ns(per_rank, faulty, "fault_ns");
      CheckTimes(checks, p, world, per_rank, [&](int r) -> std::optional<int64_t> {
        const auto issued = Ns(per_rank, r, "issued_ns");
        if (!issued || !fault) return std::nullopt;
        return std::max(*issued, *fault);
      });
    }
  };
  return s;
}

Scenario ThrowingRank() {
  Scenario s;
  s.info = FaultInfo(
      "throwing_rank",
      "after a barrier every rank issues all_reduce but the faulty rank throws first: it "
      "reports its own error and every other rank fails, at once",
      "test_multi_threaded_pg.py::TestCollectivesWithWrapper::test_collective_error_on_rank_non_"
      "zero",
      {FaultyRankSize(), DeadlineSize(10000), MaxTimeToErrorSize(), CountSize(), FaultDelaySize()});
  s.run_rank = [](RankEnv& env) {
    const int faulty = FaultyRank(env.params, env.world);
    const int64_t count = env.params.GetInt("count");
    const auto delay = std::chrono::milliseconds(env.params.GetInt("fault_delay_ms"));
    return RunFaultRank(env, [&](distributed::ProcessGroup& pg, Timeline& timeline) {
      pg.barrier();
      if (env.rank != faulty) return IssueAllReduce(pg, count, timeline);
      std::this_thread::sleep_for(delay);
      timeline.fault_ns = NowNs();
      FSDP_THROW(ErrorCode::kFailedPrecondition, "mimic a test failure on rank ", env.rank);
    });
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int faulty = FaultyRank(p, world);
    const std::string injected = "mimic a test failure on rank " + std::to_string(faulty);
    for (int r = 0; r < world; ++r) {
      if (r == faulty) {
        CheckError(checks, per_rank, r, "FailedPrecondition", {injected});
      } else {
        CheckRankFailed(checks, per_rank, r, "fails");
      }
    }
    const auto fault = Ns(per_rank, faulty, "fault_ns");
    CheckTimes(checks, p, world, per_rank, [&](int r) -> std::optional<int64_t> {
      const auto issued = Ns(per_rank, r, "issued_ns");
      if (r == faulty || !issued || !fault) return std::nullopt;
      return std::max(*issued, *fault);
    });
  };
  return s;
}

// Stops this whole process (every thread: the collective's, the watchdog's heartbeat) for
// `stopped`, as SIGSTOP or a debugger would: a child process sends SIGCONT when the time is up.
// Returns once continued. Between fork and _exit the child makes async-signal-safe calls only.
void StopThisProcessFor(std::chrono::milliseconds stopped) {
  const pid_t self = ::getpid();
  const pid_t waker = ::fork();
  FSDP_CHECK(waker >= 0, "hung_rank: cannot fork the process that continues the stopped rank");
  if (waker == 0) {
    timespec left{static_cast<time_t>(stopped.count() / 1000),
                  static_cast<long>((stopped.count() % 1000) * 1000000)};
    while (::nanosleep(&left, &left) != 0) {
    }
    ::kill(self, SIGCONT);
    ::_exit(0);
  }
  ::kill(self, SIGSTOP);
  int status = 0;
  while (::waitpid(waker, &status, 0) < 0 && errno == EINTR) {
  }
}

// How long hung_rank's faulty rank stays stopped: twice the straggler timeout `deadline` (by
// when every other rank must have failed) + stopped_ms.
std::chrono::milliseconds HungRankStopped(std::chrono::milliseconds deadline,
                                          const CaseParams& params) {
  return 2 * deadline + std::chrono::milliseconds(params.GetInt("stopped_ms"));
}

Scenario HungRank() {
  Scenario s;
  s.info = FaultInfo(
      "hung_rank",
      "after a barrier the faulty rank issues all_reduce, and fault_delay_ms later its process "
      "stops (SIGSTOP: every thread, as under a debugger) inside that all_reduce, which the "
      "others issue after it stopped; it is continued twice the straggler timeout + stopped_ms "
      "later. Every other rank fails after the group's straggler timeout, not before, naming "
      "the faulty rank (a member that hangs inside a collective every member reached); the "
      "continued rank fails at once. Process backends only: on threaded, stopping the process "
      "would stop every rank",
      "test_c10d_nccl.py::NCCLTraceTestTimeoutDumpOnStuckRanks::test_timeout_dumps",
      {FaultyRankSize(), MaxTimeToErrorSize(), CountSize(),
       ParamSpec::SizeInt("fault_delay_ms",
                          "how long after issuing the all_reduce the faulty rank's process "
                          "stops; the others issue it twice as long after the barrier",
                          200),
       ParamSpec::SizeInt("stopped_ms",
                          "how long the faulty rank's process stays stopped beyond twice the "
                          "straggler timeout (by when the others must have failed)",
                          5000)},
      FaultWorldKind::kAnyWorldGroup);
  s.info.test_runs.clear();  // ctest runs it on gloo (conform.gloo_world3_faults)
  s.run_rank = [](RankEnv& env) {
    if (dynamic_cast<fakes::ThreadedProcessGroup*>(env.pg.get()) != nullptr) {
      SkipCase(
          "stopping a rank's process needs ranks as processes; on threaded it would stop every "
          "rank");
    }
    const auto deadline = MissingPeerDeadline(env);  // skips without a straggler timeout
    const int faulty = FaultyRank(env.params, env.world);
    const int64_t count = env.params.GetInt("count");
    const auto delay = std::chrono::milliseconds(env.params.GetInt("fault_delay_ms"));
    const auto stopped = HungRankStopped(deadline, env.params);
    return RunFaultRank(
        env,
        [&](distributed::ProcessGroup& pg, Timeline& timeline) {
          pg.barrier();
          if (env.rank != faulty) {
            std::this_thread::sleep_for(2 * delay);
            return IssueAllReduce(pg, count, timeline);
          }
          std::thread stopper([&] {
            std::this_thread::sleep_for(delay);
            timeline.fault_ns = NowNs();
            StopThisProcessFor(stopped);
          });
          try {
            IssueAllReduce(pg, count, timeline);
          } catch (...) {
            stopper.join();
            throw;
          }
          stopper.join();
        },
        FaultWorldKind::kAnyWorldGroup);
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int faulty = FaultyRank(p, world);
    const auto deadline = std::chrono::milliseconds(AppliedDeadlineMs(per_rank));
    const double bound = static_cast<double>(p.GetInt("max_time_to_error_ms"));
    // Every member reached the all_reduce once the last rank issued it.
    const auto last = LastIssued(per_rank, world);
    double slowest = -1;
    for (int r = 0; r < world; ++r) {
      if (!CheckRankFailed(checks, per_rank, r, "fails") || r == faulty) continue;
      const std::string message = RankObservation(per_rank, r, "error").value("message", "");
      checks.CheckTrue(RankName(r) + " error names the hung rank " + std::to_string(faulty),
                       NamesRank(message, faulty), message);
      const auto issued = Ns(per_rank, r, "issued_ns");
      const auto error = Ns(per_rank, r, "error_ns");
      if (!issued || !error || !last) continue;
      // The watchdog reports a member only once the collective has been in flight for the
      // straggler timeout, and then within its stale window (at most the timeout again).
      const double waited = Ms(*error - *issued);
      const auto deadline_ms = static_cast<double>(deadline.count());
      checks.CheckTrue(RankName(r) + " fails no earlier than the straggler timeout after its call",
                       waited >= deadline_ms, std::to_string(waited) + " ms");
      const double after_last = Ms(*error - *last);
      checks.CheckTrue(RankName(r) + " fails within 2 x the straggler timeout + " +
                           std::to_string(bound) + " ms of the last call",
                       after_last <= 2 * deadline_ms + bound, std::to_string(after_last) + " ms");
      slowest = std::max(slowest, after_last);
    }
    if (slowest >= 0) checks.SetFigure("time_to_error_ms", slowest);
    // The continued rank: at once when it runs again (its error is due then).
    const auto fault = Ns(per_rank, faulty, "fault_ns");
    const auto error = Ns(per_rank, faulty, "error_ns");
    if (fault && error) {
      const auto stopped = static_cast<double>(HungRankStopped(deadline, p).count());
      const double after_resume = Ms(*error - *fault) - stopped;
      checks.CheckTrue(RankName(faulty) + " (continued) fails at once when it runs again",
                       after_resume <= bound, std::to_string(after_resume) + " ms");
    }
  };
  return s;
}

}  // namespace

void RegisterFaultsScenarios(ScenarioRegistry& registry) {
  registry.Add(MismatchedOp());
  registry.Add(MismatchedSize());
  registry.Add(MismatchedDtypeOrReduceOp());
  registry.Add(MismatchedRoot());
  registry.Add(MissingRank());
  registry.Add(ThrowingRank());
  registry.Add(HungRank());
}

}  // namespace fsdp::conformance
