#include "conformance/threaded_launcher.h"

#include <chrono>

#include "fakes/thread_launcher.h"

namespace fsdp::conformance {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What one rank thread's body shares with the launcher: the rank's env and its outcome (set
// by the body; read only once the launcher saw the rank finish).
struct RankSlot {
  RankEnv env;
  std::shared_ptr<const Subject> subject;
  const Scenario* scenario = nullptr;
  RankOutcome outcome;
};

}  // namespace

RankOutcome RunGuarded(const std::function<nlohmann::json()>& body) {
  const auto start = Clock::now();
  try {
    nlohmann::json obs = body();
    return RankOutcome::Ok(std::move(obs), SecondsSince(start));
  } catch (const CaseSkipped& e) {
    return RankOutcome::Skipped(e.reason(), SecondsSince(start));
  } catch (const nlohmann::json::exception& e) {
    return RankOutcome::Failed(ErrorCode::kInternal, std::string("JSON error: ") + e.what(),
                               SecondsSince(start));
  } catch (...) {
    fakes::RankError error = fakes::RankError::FromException(std::current_exception());
    return RankOutcome::Failed(error.code, std::move(error.message), SecondsSince(start));
  }
}

ThreadedLauncher::ThreadedLauncher(distributed::BackendSpec backend,
                                   std::shared_ptr<const Subject> subject)
    : backend_(std::move(backend)), subject_(std::move(subject)) {
  FSDP_CHECK(subject_ != nullptr, "ThreadedLauncher needs a subject");
  FSDP_CHECK(backend_.capabilities.ranks == distributed::RankPlacement::kThreads,
             "ThreadedLauncher: backend ", backend_.name, " runs ranks as processes");
}

std::vector<RankOutcome> ThreadedLauncher::Launch(const LaunchRequest& request) {
  FSDP_CHECK(request.scenario != nullptr, "ThreadedLauncher: no scenario");
  const int world = request.world;
  FSDP_CHECK(world >= 1, "ThreadedLauncher: world must be >= 1, got ", world);
  const std::string& name = request.scenario->info.name;
  const auto start = Clock::now();

  // The world's groups. A factory failure is every rank's failure.
  std::vector<std::shared_ptr<distributed::ProcessGroup>> groups;
  if (backend_.threaded_world) {
    const auto collective_timeout =
        std::max(std::chrono::milliseconds(1), request.timeout * 9 / 10);
    RankOutcome made = RunGuarded([&] {
      groups = backend_.threaded_world(world, collective_timeout);
      FSDP_CHECK_CODE(ErrorCode::kInternal, static_cast<int>(groups.size()) == world, "the '",
                      request.backend, "' group factory returned ", groups.size(),
                      " groups for world ", world);
      for (int r = 0; r < world; ++r) {
        FSDP_CHECK_CODE(ErrorCode::kInternal,
                        groups[r] && groups[r]->rank() == r && groups[r]->size() == world, "the '",
                        request.backend, "' group factory returned a bad group for rank ", r,
                        " of ", world);
      }
      return nlohmann::json();
    });
    if (made.status != RankOutcome::Status::kOk) {
      made.message = "creating the world group: " + made.message;
      return std::vector<RankOutcome>(world, made);
    }
  } else {
    FSDP_CHECK_CODE(ErrorCode::kUnavailable, world == 1, "scenario ", name, ": backend '",
                    request.backend,
                    "' has no process-group factory, so it can run one rank "
                    "only, not ",
                    world);
    groups.resize(1);
  }

  fakes::ThreadLaunchOptions launch;
  launch.world_size = world;
  launch.groups = std::move(groups);
  launch.device_of = [this](int r) { return backend_.DeviceOf(r); };
  launch.timeout = request.timeout;
  launch.failure_grace = request.failure_grace;
  launch.label = "scenario " + name;
  // The slots are shared with the rank threads, which may outlive this call (detached).
  // The same bytes a process rank reads from its files, through the same codec.
  std::vector<std::shared_ptr<const RankInputs>> inputs(static_cast<size_t>(world));
  if (request.inputs) inputs = request.inputs->ForAllRanks();
  std::vector<std::shared_ptr<RankSlot>> slots;
  for (int r = 0; r < world; ++r) {
    auto slot = std::make_shared<RankSlot>();
    slot->env.scenario = name;
    slot->env.rank = r;
    slot->env.world = world;
    slot->env.params = request.params;
    slot->env.backend = request.backend;
    slot->env.device = backend_.DeviceOf(r);
    slot->env.inputs = inputs[static_cast<size_t>(r)];
    slot->subject = subject_;
    slot->scenario = request.scenario;
    slots.push_back(std::move(slot));
  }
  const auto ranks = fakes::LaunchRankThreads(
      std::move(launch), [slots](fakes::ThreadRank& rank) -> std::optional<fakes::RankError> {
        RankSlot& slot = *slots[rank.rank];
        slot.env.pg = rank.pg;
        slot.outcome =
            RunGuarded([&] { return slot.subject->RunRank(*slot.scenario, slot.env); });
        slot.env.pg.reset();  // the launcher releases the group before reporting completion
        if (slot.outcome.status != RankOutcome::Status::kError) return std::nullopt;
        return fakes::RankError{slot.outcome.code, slot.outcome.message};
      });

  std::vector<RankOutcome> outcomes(world);
  for (const fakes::ThreadRankResult& r : ranks) {
    if (r.detached) {
      outcomes[r.rank] = RankOutcome::Failed(r.error->code, r.error->message, SecondsSince(start));
    } else {
      outcomes[r.rank] = slots[r.rank]->outcome;  // the rank finished: its thread is done with it
    }
  }
  return outcomes;
}

}  // namespace fsdp::conformance
