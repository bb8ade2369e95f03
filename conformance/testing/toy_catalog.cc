#include "conformance/testing/toy_catalog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "conformance/driver_protocol.h"
#include "conformance/observations.h"
#include "engine/core/error.h"
#include "fakes/threaded_backend.h"

namespace fsdp::conformance::testing {

namespace {

using namespace std::chrono_literals;
constexpr auto kToyTimeout = 3000ms;

// A process group for ranks as processes sharing a directory: every collective is an exchange
// of files. It implements all_reduce (SUM) and barrier, which is all the toy scenarios use;
// other ops are outside the toy's purpose and say so.
class StoreToyGroup final : public distributed::ProcessGroup {
 public:
  StoreToyGroup(int rank, int world, std::shared_ptr<distributed::Store> store)
      : rank_(rank), world_(world), store_(std::move(store)) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend_name() const override { return "toy"; }
  std::vector<int> global_ranks() const override {
    std::vector<int> r(world_);
    for (int i = 0; i < world_; ++i) r[i] = i;
    return r;
  }
  std::chrono::milliseconds timeout() const override { return kToyTimeout; }
  std::string group_name() const override { return "0"; }

 protected:
  std::shared_ptr<distributed::Work> all_reduce_impl(const Tensor& tensor,
                                              const distributed::ReduceOptions& options,
                                              const distributed::CollectiveInfo& /*info*/) override {
    FSDP_CHECK(options.op == distributed::ReduceOp::kSum, "toy group: all_reduce supports SUM only");
    const std::vector<double> mine = tensor.to_doubles();
    std::vector<double> sum(mine.size(), 0.0);
    for (const auto& contribution : Exchange(mine)) {
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, contribution.size() == mine.size(),
                      "toy group: all_reduce sizes differ across ranks");
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += contribution[i];
    }
    Tensor(tensor).copy_(Tensor::from_doubles(sum, tensor.sizes(), DType::kFloat64));
    return std::make_shared<distributed::CompletedWork>();
  }
  void barrier_impl(const distributed::CollectiveInfo& /*info*/) override { Exchange({}); }
  std::shared_ptr<distributed::Work> all_gather_into_tensor_impl(const Tensor&, const Tensor&,
                                                          const distributed::CollectiveInfo&) override {
    Unsupported("all_gather_into_tensor");
  }
  std::shared_ptr<distributed::Work> reduce_scatter_tensor_impl(const Tensor&, const Tensor&,
                                                         const distributed::ReduceOptions&,
                                                         const distributed::CollectiveInfo&) override {
    Unsupported("reduce_scatter_tensor");
  }
  std::shared_ptr<distributed::Work> broadcast_impl(const Tensor&, int,
                                             const distributed::CollectiveInfo&) override {
    Unsupported("broadcast");
  }
  std::shared_ptr<distributed::Work> all_gather_impl(const std::vector<Tensor>&, const Tensor&,
                                              const distributed::CollectiveInfo&) override {
    Unsupported("all_gather");
  }
  std::shared_ptr<distributed::ProcessGroup> new_group_impl(const std::vector<int>&,
                                                     const distributed::CollectiveInfo&) override {
    Unsupported("new_group");
  }

 private:
  [[noreturn]] static void Unsupported(const char* op) {
    FSDP_THROW(ErrorCode::kUnavailable, "toy group: ", op, " is not part of the toy");
  }

  // Every rank's contribution to the next collective, in rank order.
  std::vector<std::vector<double>> Exchange(const std::vector<double>& mine) {
    const uint64_t n = calls_++;
    auto key = [&](int r) { return "x" + std::to_string(n) + ".r" + std::to_string(r); };
    store_->set(key(rank_), nlohmann::json(mine).dump());
    std::vector<std::vector<double>> all(world_);
    for (int r = 0; r < world_; ++r) {
      all[r] = nlohmann::json::parse(store_->get(key(r), kToyTimeout)).get<std::vector<double>>();
    }
    return all;
  }

  int rank_;
  int world_;
  std::shared_ptr<distributed::Store> store_;
  uint64_t calls_ = 0;
};

ScenarioInfo ToyInfo(const std::string& name, const std::string& description) {
  ScenarioInfo info;
  info.name = name;
  info.description = description;
  info.seed_test = "toy_test.py::TestToy::test_" + name.substr(name.find('/') + 1);
  return info;
}

void RegisterToySum(ScenarioRegistry& registry) {
  Scenario s;
  s.info = ToyInfo("toy/sum", "each rank all-reduces (rank+1)*scale; checks value and total");
  s.info.params = {ParamSpec::Axis("mode", "plain or doubled contribution", {"plain", "doubled"}),
                   ParamSpec::SizeInt("scale", "multiplier of each contribution", 3),
                   ParamSpec::SizeInt("bias", "added to the expected total (non-zero fails)", 0)};
  s.info.default_world = 4;
  s.run_rank = [](RankEnv& env) {
    const double factor = env.params.GetString("mode") == "doubled" ? 2 : 1;
    const double value = (env.rank + 1) * env.params.GetInt("scale") * factor;
    double total = value;
    if (env.world > 1) {
      Tensor t = Tensor::from_doubles({value}, {1}, DType::kFloat64);
      env.group().all_reduce(t);
      total = t.to_doubles()[0];
    }
    nlohmann::json obs;
    obs["value"] = value;
    obs["total"] = total;
    obs[kLosses] = {total, total / 2};
    obs[kCommCounts] = {{"forward", {{"allreduce_", env.world > 1 ? 1 : 0}}},
                        {"backward", nlohmann::json::object()}};
    obs[kEvents] = nlohmann::json::array({EventJson("unshard", "", "FORWARD")});
    obs[kTensors] = {{"v", TensorJson({1}, "float64", {value})}};
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const double factor = p.GetString("mode") == "doubled" ? 2 : 1;
    const double scale = static_cast<double>(p.GetInt("scale"));
    const double total = scale * factor * world * (world + 1) / 2 + p.GetInt("bias");
    for (int r = 0; r < world; ++r) {
      const std::string who = "rank " + std::to_string(r);
      checks.CheckEqual(who + " value", (r + 1) * scale * factor,
                        RankObservation(per_rank, r, "value"));
      checks.CheckClose(who + " total", std::vector<double>{total},
                        std::vector<double>{RankObservation(per_rank, r, "total").get<double>()});
      checks.CheckClose(who + " tensor v", std::vector<double>{(r + 1) * scale * factor},
                        TensorData(per_rank, r, "v"));
      checks.CheckEqual(who + " forward allreduce_", world > 1 ? 1 : 0,
                        CommCount(per_rank, r, "forward", "allreduce_"));
    }
    checks.SetFigure("world", world);
  };
  registry.Add(std::move(s));
}

void RegisterToyMatrix(ScenarioRegistry& registry) {
  Scenario s;
  s.info = ToyInfo("toy/matrix", "reports its parameters; exercises exclusion and skips");
  s.info.params = {ParamSpec::Axis("a", "first axis", {"x", "y"}),
                   ParamSpec::Axis("b", "second axis", {"1", "2", "3"})};
  s.info.default_world = 2;
  s.info.requirements.in_process = true;
  s.excluded = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (p.GetString("a") == "y" && p.GetInt("b") == 3) return "the seed never runs y with 3";
    return std::nullopt;
  };
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    if (p.GetInt("b") == 2 && world % 2 == 1) return "b=2 needs an even world";
    return std::nullopt;
  };
  s.run_rank = [](RankEnv& env) {
    return nlohmann::json{{"a", env.params.GetString("a")}, {"b", env.params.GetInt("b")}};
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual("rank " + std::to_string(r) + " a", p.GetString("a"),
                        RankObservation(per_rank, r, "a"));
    }
  };
  registry.Add(std::move(s));
}

void RegisterToyFlaws(ScenarioRegistry& registry) {
  Scenario s;
  s.info = ToyInfo("toy/flaws", "fails in the way its 'flaw' parameter says");
  s.info.params = {ParamSpec::SizeString("flaw",
                                         "none, rank_error, skip, sleep, bad_obs, no_checks, "
                                         "judge_throws, nondeterministic",
                                         "none"),
                   ParamSpec::SizeInt("bad_rank", "the rank that fails for rank_error", 1),
                   ParamSpec::SizeInt("sleep_ms", "how long every rank sleeps for sleep", 1500)};
  s.info.default_world = 2;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.deterministic = true;
  s.run_rank = [](RankEnv& env) -> nlohmann::json {
    const std::string flaw = env.params.GetString("flaw");
    if (flaw == "nondeterministic") {
      // A value that changes from one run of the case to the next (per process).
      static std::atomic<int64_t> runs{0};
      return {{"rank", env.rank}, {"run", runs.fetch_add(1)}};
    }
    if (flaw == "rank_error" && env.rank == env.params.GetInt("bad_rank")) {
      // In a process, this lands in the rank's log, whose tail the error report carries.
      if (env.backend != kBackendThreaded)
        std::fprintf(stderr, "rank %d is about to fail\n", env.rank);
      FSDP_THROW(ErrorCode::kFailedPrecondition, "toy failure on rank ", env.rank);
    }
    if (flaw == "skip") SkipCase("toy cannot run this here");
    if (flaw == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(env.params.GetInt("sleep_ms")));
    }
    if (flaw == "bad_obs") return {{kLosses, "not an array"}};
    if (env.world > 1) env.group().barrier();
    return {{"rank", env.rank}};
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const std::string flaw = p.GetString("flaw");
    if (flaw == "no_checks") return;
    if (flaw == "judge_throws") RankObservation(per_rank, 0, "missing_key");
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual("rank " + std::to_string(r), r, RankObservation(per_rank, r, "rank"));
    }
  };
  registry.Add(std::move(s));
}

void RegisterToyGpu(ScenarioRegistry& registry) {
  Scenario s;
  s.info = ToyInfo("toy/gpu", "needs a GPU");
  s.info.requirements.devices = {DeviceType::kCUDA};
  s.info.default_world = 1;
  s.run_rank = [](RankEnv&) { return nlohmann::json::object(); };
  s.judge = [](const CaseParams&, int, const std::vector<nlohmann::json>&, CheckList& checks) {
    checks.CheckTrue("ran", true);
  };
  registry.Add(std::move(s));
}

}  // namespace

std::shared_ptr<distributed::ProcessGroup> MakeStoreToyGroup(
    int rank, int world, std::shared_ptr<distributed::Store> store) {
  return std::make_shared<StoreToyGroup>(rank, world, std::move(store));
}

std::unique_ptr<Catalog> MakeToyCatalog() {
  auto catalog = std::make_unique<Catalog>();
  RegisterToySum(catalog->scenarios);
  RegisterToyMatrix(catalog->scenarios);
  RegisterToyFlaws(catalog->scenarios);
  RegisterToyGpu(catalog->scenarios);
  catalog->backends = fakes::DefaultBackends();
  distributed::BackendSpec toyproc;
  toyproc.name = kToyProcBackend;
  toyproc.description = "toy: one process per rank, a toy group over the rendezvous store";
  toyproc.capabilities.ranks = distributed::RankPlacement::kProcesses;
  toyproc.capabilities.collectives = {distributed::CollectiveOp::kAllreduce,
                                      distributed::CollectiveOp::kBarrier};
  toyproc.process_group = [](const distributed::ProcessGroupSpec& spec) {
    return MakeStoreToyGroup(spec.rank, spec.world, spec.store);
  };
  catalog->backends.Register(std::move(toyproc));
  catalog->subjects.Add(kEngineSubject, [] { return std::make_shared<EngineSubject>(); });
  return catalog;
}

const Catalog& ToyCatalog() {
  static const Catalog* catalog = MakeToyCatalog().release();  // outlives detached ranks
  return *catalog;
}

}  // namespace fsdp::conformance::testing
