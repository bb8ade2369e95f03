#include "conformance/testing/toy_catalog.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "conformance/driver_protocol.h"
#include "conformance/observations.h"
#include "engine/core/error.h"

namespace fsdp::conformance::testing {

namespace {

using namespace std::chrono_literals;
constexpr auto kToyTimeout = 3000ms;

// A process group for ranks as processes sharing a directory: every collective is an exchange
// of files. It implements all_reduce (SUM) and barrier, which is all the toy scenarios use;
// other ops are outside the toy's purpose and say so.
class FileToyGroup final : public dist::ProcessGroup {
 public:
  FileToyGroup(int rank, int world, std::string dir)
      : rank_(rank), world_(world), dir_(std::move(dir)) {}
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
  std::shared_ptr<dist::Work> all_reduce_impl(const Tensor& tensor,
                                              const dist::ReduceOptions& options,
                                              const dist::CollectiveInfo& /*info*/) override {
    FSDP_CHECK(options.op == dist::ReduceOp::kSum, "toy group: all_reduce supports SUM only");
    const std::vector<double> mine = tensor.to_doubles();
    std::vector<double> sum(mine.size(), 0.0);
    for (const auto& contribution : Exchange(mine)) {
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, contribution.size() == mine.size(),
                      "toy group: all_reduce sizes differ across ranks");
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += contribution[i];
    }
    Tensor(tensor).copy_(Tensor::from_doubles(sum, tensor.sizes(), DType::kFloat64));
    return std::make_shared<dist::CompletedWork>();
  }
  void barrier_impl(const dist::CollectiveInfo& /*info*/) override { Exchange({}); }
  std::shared_ptr<dist::Work> all_gather_into_tensor_impl(const Tensor&, const Tensor&,
                                                          const dist::CollectiveInfo&) override {
    Unsupported("all_gather_into_tensor");
  }
  std::shared_ptr<dist::Work> reduce_scatter_tensor_impl(const Tensor&, const Tensor&,
                                                         const dist::ReduceOptions&,
                                                         const dist::CollectiveInfo&) override {
    Unsupported("reduce_scatter_tensor");
  }
  std::shared_ptr<dist::Work> broadcast_impl(const Tensor&, int,
                                             const dist::CollectiveInfo&) override {
    Unsupported("broadcast");
  }
  std::shared_ptr<dist::Work> all_gather_impl(const std::vector<Tensor>&, const Tensor&,
                                              const dist::CollectiveInfo&) override {
    Unsupported("all_gather");
  }
  std::shared_ptr<dist::ProcessGroup> new_group_impl(const std::vector<int>&,
                                                     const dist::CollectiveInfo&) override {
    Unsupported("new_group");
  }

 private:
  [[noreturn]] static void Unsupported(const char* op) {
    FSDP_THROW(ErrorCode::kUnavailable, "toy group: ", op, " is not part of the toy");
  }

  // Every rank's contribution to the next collective, in rank order.
  std::vector<std::vector<double>> Exchange(const std::vector<double>& mine) {
    const uint64_t n = calls_++;
    auto path = [&](int r) { return dir_ + "/x" + std::to_string(n) + ".r" + std::to_string(r); };
    WriteFileAtomically(path(rank_), nlohmann::json(mine).dump());
    std::vector<std::vector<double>> all(world_);
    const auto deadline = std::chrono::steady_clock::now() + kToyTimeout;
    for (int r = 0; r < world_; ++r) {
      while (!std::filesystem::exists(path(r))) {
        FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, std::chrono::steady_clock::now() < deadline,
                        "toy file group: rank ", rank_, " waited past the deadline for rank ", r);
        std::this_thread::sleep_for(1ms);
      }
      std::ifstream in(path(r));
      all[r] = nlohmann::json::parse(in).get<std::vector<double>>();
    }
    return all;
  }

  int rank_;
  int world_;
  std::string dir_;
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
  s.info.backends = {kBackendThreaded, kBackendGloo, kBackendNccl, kToyProcBackend};
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
  s.info.backends = {kBackendThreaded};
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
                                         "judge_throws",
                                         "none"),
                   ParamSpec::SizeInt("bad_rank", "the rank that fails for rank_error", 1),
                   ParamSpec::SizeInt("sleep_ms", "how long every rank sleeps for sleep", 1500)};
  s.info.default_world = 2;
  s.info.backends = {kBackendThreaded, kBackendGloo, kToyProcBackend};
  s.run_rank = [](RankEnv& env) -> nlohmann::json {
    const std::string flaw = env.params.GetString("flaw");
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
  s.info.requires_gpu = true;
  s.info.default_world = 1;
  s.run_rank = [](RankEnv&) { return nlohmann::json::object(); };
  s.judge = [](const CaseParams&, int, const std::vector<nlohmann::json>&, CheckList& checks) {
    checks.CheckTrue("ran", true);
  };
  registry.Add(std::move(s));
}

}  // namespace

std::shared_ptr<dist::ProcessGroup> MakeFileToyGroup(int rank, int world,
                                                     const std::string& store_dir) {
  return std::make_shared<FileToyGroup>(rank, world, store_dir);
}

std::unique_ptr<Catalog> MakeToyCatalog() {
  auto catalog = std::make_unique<Catalog>();
  RegisterToySum(catalog->scenarios);
  RegisterToyMatrix(catalog->scenarios);
  RegisterToyFlaws(catalog->scenarios);
  RegisterToyGpu(catalog->scenarios);
  RegisterDefaultBackends(catalog->backends);
  Backend toyproc;
  toyproc.name = kToyProcBackend;
  toyproc.description = "toy: one process per rank, file-based toy group";
  toyproc.mode = LaunchMode::kProcesses;
  toyproc.process_group = [](const ProcessGroupSpec& spec) {
    return MakeFileToyGroup(spec.rank, spec.world, spec.store_dir);
  };
  catalog->backends.Add(std::move(toyproc));
  catalog->subjects.Add(kEngineSubject, [] { return std::make_shared<EngineSubject>(); });
  return catalog;
}

const Catalog& ToyCatalog() {
  static const Catalog* catalog = MakeToyCatalog().release();  // outlives detached ranks
  return *catalog;
}

}  // namespace fsdp::conformance::testing
