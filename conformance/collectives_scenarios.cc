// Family `collectives`: every collective of distributed::ProcessGroup on its own, on any backend,
// with c10d's semantics (mirroring torch.distributed's own tests of the collectives:
// test_multi_threaded_pg.py, test_c10d_nccl.py, distributed_test.py):
//   all_gather_into_tensor   _allgather_base_       dtype x in_place x async_op
//   reduce_scatter_tensor    _reduce_scatter_base_  dtype x op x in_place x async_op
//   all_reduce               allreduce_             dtype x op x async_op x api (c10d or
//                                                   the functional all_reduce)
//   broadcast                broadcast_             dtype x async_op, root a size
//   broadcast_group          new_group, broadcast_  a group of every rank but 0 listed unsorted:
//                                                   its ranks' order, get_rank / get_world_size
//                                                   (-1 outside it), a broadcast from each member
//   all_gather               allgather_ (a list)    dtype x counts x in_place x async_op
//   barrier                  barrier                nobody leaves before the last one entered;
//                                                   under a CommDebugMode, with one all_reduce
//                                                   after the rounds, only the all_reduce counts
//   device_mesh              init_device_mesh,      coordinates, local ranks, each dim's group
//                            DeviceMesh(ranks)      (its ranks, and an all-gather over it), the
//                                                   sub-meshes of single and adjacent dims; a
//                                                   mesh over a subset of the world (mesh_ranks)
//
// Inputs and expected results follow [Note: exact collective data] (collective_data.h): small
// integers from (rank, index, world) that tell every reduce op apart and expose a lost,
// doubled or misplaced rank; the judges compare exactly (Tolerance{0, 0}).
//
// Observations (each scenario's schema): the tensors after the call ("output", "tensor",
// "outputs"; out-of-place inputs as "input", which must be unchanged), "work" (the Work of an
// async_op=True call), and for the reductions "error". Every scenario but barrier states its
// expected observations (Scenario::expect, derived by the data's rules), and its judge compares
// every rank with them: tensors exactly, by dtype, shape and values.
//
// The judges check what c10d promises and nothing of our engine's own making (the engine's
// tests check that: engine/distributed/gloo/gloo_process_group_test.cc and
// fakes/threaded_process_group_test.cc):
//   * async_op=True returns a Work whose wait() returns; async_op=False returns nothing to
//     check (torch returns None);
//   * AVG and PREMUL_SUM on int64 (ReductionIsRejected) fail on every rank, whatever the
//     error's type and wording, and the group stays usable: every rank then all-reduces
//     (SUM) a fresh copy of its input, reported as "after_rejection", whose result the judge
//     checks. The failure itself is the suite's choice (docs/scenarios.md, "Where the suite
//     chooses").
#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conformance/collective_data.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/functional_collectives.h"
#include "engine/distributed/process_group.h"

namespace fsdp::conformance {

namespace {

constexpr double kSentinel = -200;  // initial output contents; never a valid result
const std::vector<std::string> kDTypes = {"float32", "float64", "float16", "bfloat16", "int64"};
const std::vector<std::string> kReduceOps = {"sum", "avg", "min", "max", "premul_sum"};

distributed::ReduceOp ParseReduceOp(const std::string& name) {
  if (name == "sum") return distributed::ReduceOp::kSum;
  if (name == "avg") return distributed::ReduceOp::kAvg;
  if (name == "min") return distributed::ReduceOp::kMin;
  if (name == "max") return distributed::ReduceOp::kMax;
  if (name == "premul_sum") return distributed::ReduceOp::kPremulSum;
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown reduce op '", name,
             "'; ops: sum, avg, min, max, premul_sum");
}

distributed::ReduceOptions ReduceOptionsFor(distributed::ReduceOp op, int rank, int world) {
  return {op, op == distributed::ReduceOp::kPremulSum ? PremulFactor(rank, world) : 1.0};
}

// ---- Parameters -----------------------------------------------------------------------------

ParamSpec DTypeAxis() { return ParamSpec::Axis("dtype", "tensor dtype", kDTypes); }
ParamSpec ReduceOpAxis() {
  return ParamSpec::Axis(
      "op", "ReduceOp (premul_sum: per-rank factors 2, 4, 2, 4, ...)",
      kReduceOps);
}
ParamSpec InPlaceAxis(const std::string& what) {
  return ParamSpec::Axis("in_place", what, {"False", "True"});
}
ParamSpec AsyncAxis() {
  return ParamSpec::Axis("async_op", "async_op=True returns a Work that is waited on",
                         {"False", "True"});
}
ParamSpec CountSize(const std::string& what, int64_t value) {
  return ParamSpec::SizeInt("count", what, value);
}

// The worlds ctest runs besides the default (4): every case at 1, 2, 3 and 8, and at 128 the
// cases of one dtype (bfloat16, the least precise) with async_op=True (the Work path) to keep
// the suite fast. `fixes_axes`: false for barrier, which has neither axis.
std::vector<TestRun> CollectiveTestRuns(bool fixes_axes = true) {
  std::map<std::string, std::string> at_128;
  if (fixes_axes) at_128 = {{"dtype", "bfloat16"}, {"async_op", "True"}};
  return {{1, {}}, {2, {}}, {3, {}}, {8, {}}, {128, at_128}};
}

// The common ScenarioInfo of the family.
ScenarioInfo CollectiveInfo(const std::string& name, const std::string& description,
                            const std::string& seed_test, std::vector<ParamSpec> params) {
  ScenarioInfo info;
  info.name = "collectives/" + name;
  info.description = description;
  info.seed_test = seed_test;
  info.params = std::move(params);
  info.default_world = 4;
  info.min_world = 1;
  info.max_world = 128;
  info.test_runs = CollectiveTestRuns();
  return info;
}

// ---- Rank side ------------------------------------------------------------------------------

Tensor MakeTensor(const std::vector<double>& values, DType dtype, const Device& device) {
  return Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, dtype, device);
}

// An async_op=True call's Work: waits on it (an error is the rank's error) and reports whether
// there was one ({"returned": bool, "waited": bool}). Null for async_op=False, where torch
// returns nothing.
nlohmann::json FinishWork(const std::shared_ptr<distributed::Work>& work, bool async_op) {
  if (!async_op) return nullptr;
  if (work != nullptr) work->wait();
  return {{"returned", work != nullptr}, {"waited", work != nullptr}};
}

nlohmann::json ErrorJson(const Error& e) {
  return {{"code", ErrorCodeName(e.code())}, {"message", e.message()}};
}

// After a reduction failed on every rank: the group must still be usable, so every rank
// all-reduces (SUM) a fresh copy of its input `values` and reports the result as
// "after_rejection". This also keeps a rank from exiting before its peers finished connecting
// on process backends (see the gloo note in docs/scenarios.md).
nlohmann::json RejectedObservations(const Error& e, distributed::ProcessGroup& group,
                                    const std::vector<double>& values, DType dtype,
                                    const Device& device) {
  nlohmann::json obs;
  obs["error"] = ErrorJson(e);
  obs["work"] = nullptr;
  Tensor again = MakeTensor(values, dtype, device);
  group.all_reduce(again, distributed::Sum());
  obs[kTensors]["after_rejection"] = TensorToJson(again);
  return obs;
}

// ---- Schemas --------------------------------------------------------------------------------

nlohmann::json NullOr(nlohmann::json object_schema) {
  object_schema["type"] = {"object", "null"};
  return object_schema;
}

// "work": the Work of an async_op=True call.
ObservationKey WorkKey(bool can_fail) {
  return ObservationKey::Custom(
      "work",
      NullOr({{"required", {"returned", "waited"}},
              {"additionalProperties", false},
              {"properties",
               {{"returned", {{"type", "boolean"}}}, {"waited", {{"type", "boolean"}}}}}}),
      std::string("async_op=True: {\"returned\": the call returned a Work (not None), "
                  "\"waited\": work.wait() returned}; null when async_op=False (torch returns "
                  "None)") +
          (can_fail ? " or when the call raised" : ""));
}

// "error" of the reductions.
ObservationKey ErrorKey() {
  return ObservationKey::Custom(
      "error",
      NullOr({{"required", {"code", "message"}},
              {"additionalProperties", false},
              {"properties",
               {{"code", {{"type", "string"}}}, {"message", {{"type", "string"}}}}}}),
      "null when the call returned; otherwise what it raised: {\"code\": the error's kind (an "
      "ErrorCode name, or the Python exception type), \"message\": its text}. Only AVG and "
      "PREMUL_SUM on int64 must raise (any exception passes); then the rank reports no "
      "output tensors but \"after_rejection\"");
}

TensorObservation InputTensor(const std::string& shape, const std::string& values) {
  return {"input", "the case's dtype", shape,
          "the input after the call (out of place only: in_place=False; absent in place or "
          "when the call raised): unchanged, " + values,
          /*required=*/false};
}

TensorObservation AfterRejectionTensor(const std::string& shape) {
  return {"after_rejection", "int64", shape,
          "only when the call raised (AVG or PREMUL_SUM on int64): a fresh copy of the rank's "
          "input after all_reduce(op=SUM) over the same group, which must still work",
          /*required=*/false};
}

// ---- Expected observations ------------------------------------------------------------------

nlohmann::json ExpectedWork(bool async_op) {
  return async_op ? nlohmann::json{{"returned", true}, {"waited", true}} : nlohmann::json();
}

nlohmann::json ValuesJson(const std::vector<double>& values, const std::string& dtype) {
  return TensorJson({static_cast<int64_t>(values.size())}, dtype, values);
}

// A rejected reduction (AVG or PREMUL_SUM on int64): any error, then the SUM of every rank's
// `input` (a 1-D reduction input of `layout`, `numel` elements) on the rank.
nlohmann::json ExpectedRejection(distributed::ReduceOp op, const ReduceLayout& layout,
                                 int64_t numel) {
  nlohmann::json e;
  e["error"] = {{"code", ErrorCodeName(ErrorCode::kInvalidArgument)},
                {"message", std::string("ReduceOp.") + distributed::ReduceOpName(op) +
                                " on int64 is rejected (any exception passes)"}};
  e["work"] = nullptr;
  e[kTensors]["after_rejection"] =
      ValuesJson(ExpectedReductions(distributed::ReduceOp::kSum, layout, 0, numel), "int64");
  return e;
}

// ---- Judge side -----------------------------------------------------------------------------

// Judges every rank against `expected` (the scenario's expect):
//   * an expected error (a rejected reduction): the rank reported an error, any; otherwise a
//     scenario that reports "error" must report null (the call returned);
//   * "work" when async_op=True (for async_op=False torch returns None: nothing to check);
//   * "output_numels" (all_gather) equal;
//   * every expected tensor exactly (dtype, shape, values).
void JudgeAgainstExpected(CheckList& checks, const std::vector<nlohmann::json>& per_rank,
                          const std::vector<nlohmann::json>& expected) {
  for (int r = 0; r < static_cast<int>(expected.size()); ++r) {
    const nlohmann::json& e = expected[static_cast<size_t>(r)];
    if (e.contains("error")) {
      const nlohmann::json& error = e.at("error");
      if (error.is_null()) {
        CheckRankEqual(checks, per_rank, r, {"error", "call returned (no error)", nullptr});
      } else {
        CheckRankFailed(checks, per_rank, r, "raises: " + error.at("message").get<std::string>());
      }
    }
    if (e.contains("work") && !e.at("work").is_null()) {
      CheckRankEqual(checks, per_rank, r,
                     {"work", "async_op=True returned a Work and wait() returned", e.at("work")});
    }
    if (e.contains("output_numels")) {
      CheckRankEqual(checks, per_rank, r,
                     {"output_numels", "numels of outputs[0..world)", e.at("output_numels")});
    }
    CheckRankTensorsExact(checks, per_rank, r, e.at(kTensors));
  }
}

// The reductions' figure "rejected" ("AVG/int64") for the cases whose call must raise.
void SetRejectedFigure(const CaseParams& p, CheckList& checks) {
  const distributed::ReduceOp op = ParseReduceOp(p.GetString("op"));
  const std::string dtype = p.GetString("dtype");
  if (ReductionIsRejected(op, ParseDType(dtype))) {
    checks.SetFigure("rejected", std::string(distributed::ReduceOpName(op)) + "/" + dtype);
  }
}

// ---- Scenarios ------------------------------------------------------------------------------

std::vector<nlohmann::json> ExpectAllGatherIntoTensor(const CaseParams& p, int world) {
  const std::string dtype = p.GetString("dtype");
  const int64_t count = p.GetInt("count");
  std::vector<double> gathered;
  for (int q = 0; q < world; ++q) {
    const auto chunk = GatherValues(q, count);
    gathered.insert(gathered.end(), chunk.begin(), chunk.end());
  }
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e["work"] = ExpectedWork(p.GetBool("async_op"));
    e[kTensors]["output"] = ValuesJson(gathered, dtype);
    if (!p.GetBool("in_place")) e[kTensors]["input"] = ValuesJson(GatherValues(r, count), dtype);
  }
  return expected;
}

Scenario AllGatherIntoTensor() {
  Scenario s;
  s.info = CollectiveInfo(
      "all_gather_into_tensor",
      "all_gather_into_tensor: every rank's output is the rank-major concat of every rank's "
      "input (in place: the input is the output's own chunk)",
      "test_c10d_nccl.py::ProcessGroupNCCLTest::test_allgather_base_basics",
      {DTypeAxis(), InPlaceAxis("input is output's chunk rank"), AsyncAxis(),
       CountSize("elements per rank", 7)});
  s.info.observations.Add(WorkKey(/*can_fail=*/false))
      .AddTensors({"output", "the case's dtype", "[world * count]",
                   "the output after all_gather_into_tensor(output, input): element q * count + "
                   "i is rank q's input element i, (7q + 3i) mod 251 - 125 (it starts as -200 "
                   "everywhere; in place, the input is its chunk rank)"})
      .AddTensors(InputTensor("[count]", "element i is (7 * rank + 3i) mod 251 - 125"));
  s.run_rank = [](RankEnv& env) {
    const DType dtype = ParseDType(env.params.GetString("dtype"));
    const bool in_place = env.params.GetBool("in_place");
    const bool async_op = env.params.GetBool("async_op");
    const int64_t count = env.params.GetInt("count");
    const std::vector<double> mine = GatherValues(env.rank, count);
    Tensor output = Tensor::full({env.world * count}, kSentinel, dtype, env.device);
    Tensor input;
    if (in_place) {
      input = output.narrow(0, env.rank * count, count);
      input.copy_(MakeTensor(mine, dtype, env.device));
    } else {
      input = MakeTensor(mine, dtype, env.device);
    }
    auto work = env.group().all_gather_into_tensor(output, input, async_op);
    nlohmann::json obs;
    obs["work"] = FinishWork(work, async_op);
    obs[kTensors]["output"] = TensorToJson(output);
    if (!in_place) obs[kTensors]["input"] = TensorToJson(input);
    return obs;
  };
  s.expect = ExpectAllGatherIntoTensor;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeAgainstExpected(checks, per_rank, ExpectAllGatherIntoTensor(p, world));
  };
  return s;
}

std::vector<nlohmann::json> ExpectReduceScatterTensor(const CaseParams& p, int world) {
  const std::string dtype = p.GetString("dtype");
  const distributed::ReduceOp op = ParseReduceOp(p.GetString("op"));
  const int64_t count = p.GetInt("count");
  const ReduceLayout layout{world, count};
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    if (ReductionIsRejected(op, ParseDType(dtype))) {
      e = ExpectedRejection(op, layout, world * count);
      continue;
    }
    e["error"] = nullptr;
    e["work"] = ExpectedWork(p.GetBool("async_op"));
    e[kTensors]["output"] = ValuesJson(ExpectedReductions(op, layout, r * count, count), dtype);
    if (!p.GetBool("in_place")) {
      e[kTensors]["input"] = ValuesJson(ReduceInputs(layout, r, 0, world * count), dtype);
    }
  }
  return expected;
}

Scenario ReduceScatterTensor() {
  Scenario s;
  s.info = CollectiveInfo(
      "reduce_scatter_tensor",
      "reduce_scatter_tensor: rank r's output is chunk r of the reduction of every rank's "
      "input (in place: the output is the input's own chunk); AVG/PREMUL_SUM on int64 fail on "
      "every rank",
      "test_c10d_nccl.py::ProcessGroupNCCLTest::test_reduce_scatter_base_basics",
      {DTypeAxis(), ReduceOpAxis(), InPlaceAxis("output is input's chunk rank"), AsyncAxis(),
       CountSize("output elements per rank (the input has world * count)", 7)});
  s.info.observations.Add(ErrorKey())
      .Add(WorkKey(/*can_fail=*/true))
      .AddTensors({"output", "the case's dtype", "[count]",
                   "the output after reduce_scatter_tensor(output, input, op): chunk rank of "
                   "the reduction of every rank's input (premul_sum: rank r's input times "
                   "PremulFactor(r, world): 2 for even r, 4 for odd r); it starts "
                   "as -200 (in place, it is the input's "
                   "chunk rank); absent when the call raised",
                   /*required=*/false})
      .AddTensors(InputTensor("[world * count]",
                              "ReduceInput({world, count}, rank, i) of conformance/"
                              "collective_data.h at element i"))
      .AddTensors(AfterRejectionTensor("[world * count]"));
  s.run_rank = [](RankEnv& env) {
    const DType dtype = ParseDType(env.params.GetString("dtype"));
    const distributed::ReduceOp op = ParseReduceOp(env.params.GetString("op"));
    const bool in_place = env.params.GetBool("in_place");
    const bool async_op = env.params.GetBool("async_op");
    const int64_t count = env.params.GetInt("count");
    const std::vector<double> values =
        ReduceInputs({env.world, count}, env.rank, 0, env.world * count);
    Tensor input = MakeTensor(values, dtype, env.device);
    Tensor output = in_place ? input.narrow(0, env.rank * count, count)
                             : Tensor::full({count}, kSentinel, dtype, env.device);
    nlohmann::json obs;
    obs["error"] = nullptr;
    try {
      auto work = env.group().reduce_scatter_tensor(
          output, input, ReduceOptionsFor(op, env.rank, env.world), async_op);
      obs["work"] = FinishWork(work, async_op);
    } catch (const Error& e) {
      if (!ReductionIsRejected(op, dtype)) throw;
      return RejectedObservations(e, env.group(), values, dtype, env.device);
    }
    obs[kTensors]["output"] = TensorToJson(output);
    if (!in_place) obs[kTensors]["input"] = TensorToJson(input);
    return obs;
  };
  s.expect = ExpectReduceScatterTensor;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeAgainstExpected(checks, per_rank, ExpectReduceScatterTensor(p, world));
    SetRejectedFigure(p, checks);
  };
  return s;
}

// all_reduce's api=functional: funcol.all_reduce (torch.distributed._functional_collectives),
// which returns a new tensor and leaves its input unchanged.
bool IsFunctional(const CaseParams& p) { return p.GetString("api") == "functional"; }

std::vector<nlohmann::json> ExpectAllReduce(const CaseParams& p, int world) {
  const std::string dtype = p.GetString("dtype");
  const distributed::ReduceOp op = ParseReduceOp(p.GetString("op"));
  const int64_t count = p.GetInt("count");
  const ReduceLayout layout{world, count};
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    if (ReductionIsRejected(op, ParseDType(dtype))) {
      e = ExpectedRejection(op, layout, count);
      continue;
    }
    e["error"] = nullptr;
    e["work"] = ExpectedWork(p.GetBool("async_op"));
    e[kTensors]["tensor"] = ValuesJson(ExpectedReductions(op, layout, 0, count), dtype);
    if (IsFunctional(p))
      e[kTensors]["input"] = ValuesJson(ReduceInputs(layout, r, 0, count), dtype);
  }
  return expected;
}

Scenario AllReduce() {
  Scenario s;
  s.info = CollectiveInfo(
      "all_reduce",
      "all_reduce (in place): every rank's tensor becomes the reduction of every rank's "
      "tensor; AVG/PREMUL_SUM on int64 fail on every rank",
      "test_multi_threaded_pg.py::TestCollectivesWithBaseClass::test_all_reduce",
      {DTypeAxis(), ReduceOpAxis(), AsyncAxis(),
       ParamSpec::Axis("api",
                       "c10d: dist.all_reduce(tensor) in place; functional: "
                       "funcol.all_reduce(input) returns the reduction as a new tensor and "
                       "leaves the input unchanged (no async_op)",
                       {"c10d", "functional"}),
       CountSize("elements (need not divide by the world)", 7)});
  s.info.observations.Add(ErrorKey())
      .Add(WorkKey(/*can_fail=*/true))
      .AddTensors({"tensor", "the case's dtype", "[count]",
                   "the tensor after all_reduce(tensor, op) (api=functional: the tensor "
                   "funcol.all_reduce returned): the reduction of every rank's "
                   "tensor, which starts as ReduceInput({world, count}, rank, i) of "
                   "conformance/collective_data.h at element i (premul_sum: rank r's times "
                   "PremulFactor(r, world): 2 for even r, 4 for odd r); absent "
                   "when the call raised",
                   /*required=*/false})
      .AddTensors({"input", "the case's dtype", "[count]",
                   "api=functional only (absent for c10d or when the call raised): the input "
                   "after funcol.all_reduce returned, unchanged: ReduceInput({world, count}, "
                   "rank, i) of conformance/collective_data.h at element i",
                   /*required=*/false})
      .AddTensors(AfterRejectionTensor("[count]"));
  s.skip = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (IsFunctional(p) && p.GetBool("async_op")) {
      return "funcol.all_reduce has no async_op (it returns an AsyncCollectiveTensor)";
    }
    return std::nullopt;
  };
  s.run_rank = [](RankEnv& env) {
    const DType dtype = ParseDType(env.params.GetString("dtype"));
    const distributed::ReduceOp op = ParseReduceOp(env.params.GetString("op"));
    const bool async_op = env.params.GetBool("async_op");
    const int64_t count = env.params.GetInt("count");
    const std::vector<double> values = ReduceInputs({env.world, count}, env.rank, 0, count);
    Tensor tensor = MakeTensor(values, dtype, env.device);
    nlohmann::json obs;
    obs["error"] = nullptr;
    const distributed::ReduceOptions options = ReduceOptionsFor(op, env.rank, env.world);
    try {
      if (IsFunctional(env.params)) {
        Tensor reduced = distributed::funcol::all_reduce(tensor, options, env.group());
        obs["work"] = nullptr;
        obs[kTensors]["tensor"] = TensorToJson(reduced);
        obs[kTensors]["input"] = TensorToJson(tensor);
        return obs;
      }
      auto work = env.group().all_reduce(tensor, options, async_op);
      obs["work"] = FinishWork(work, async_op);
    } catch (const Error& e) {
      if (!ReductionIsRejected(op, dtype)) throw;
      return RejectedObservations(e, env.group(), values, dtype, env.device);
    }
    obs[kTensors]["tensor"] = TensorToJson(tensor);
    return obs;
  };
  s.expect = ExpectAllReduce;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeAgainstExpected(checks, per_rank, ExpectAllReduce(p, world));
    SetRejectedFigure(p, checks);
  };
  return s;
}

// `root` as given (negative counts from the end, like a Python index), resolved for `world`.
int ResolveRoot(int64_t root, int world) {
  const int64_t resolved = root < 0 ? root + world : root;
  FSDP_CHECK(resolved >= 0 && resolved < world, "parameter root=", root, " is not a rank of world ",
             world, " (use 0..", world - 1, " or -1..-", world, ")");
  return static_cast<int>(resolved);
}

std::vector<nlohmann::json> ExpectBroadcast(const CaseParams& p, int world) {
  const int root = ResolveRoot(p.GetInt("root"), world);
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (nlohmann::json& e : expected) {
    e["work"] = ExpectedWork(p.GetBool("async_op"));
    e[kTensors]["tensor"] = ValuesJson(GatherValues(root, p.GetInt("count")), p.GetString("dtype"));
  }
  return expected;
}

Scenario Broadcast() {
  Scenario s;
  s.info = CollectiveInfo(
      "broadcast",
      "broadcast: every rank's tensor becomes the root's; the root's is "
      "unchanged",
      "test_multi_threaded_pg.py::TestCollectivesWithBaseClass::test_broadcast",
      {DTypeAxis(), AsyncAxis(),
       ParamSpec::SizeInt("root", "source rank; negative counts from the end (-1: the last rank)",
                          -1,
                          /*minimum=*/std::nullopt),
       CountSize("elements", 7)});
  s.info.observations.Add(WorkKey(/*can_fail=*/false))
      .AddTensors({"tensor", "the case's dtype", "[count]",
                   "the tensor after broadcast(tensor, src=root): the root's, element i "
                   "(7 * root + 3i) mod 251 - 125 (every rank starts from its own values, "
                   "(7 * rank + 3i) mod 251 - 125)"});
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    const int64_t root = p.GetInt("root");
    if (root >= world || root < -world) {
      return "root " + std::to_string(root) + " is not a rank of world " + std::to_string(world);
    }
    return std::nullopt;
  };
  s.run_rank = [](RankEnv& env) {
    const DType dtype = ParseDType(env.params.GetString("dtype"));
    const bool async_op = env.params.GetBool("async_op");
    const int root = ResolveRoot(env.params.GetInt("root"), env.world);
    // Every rank starts from its own values; only the root's must survive.
    Tensor tensor =
        MakeTensor(GatherValues(env.rank, env.params.GetInt("count")), dtype, env.device);
    auto work = env.group().broadcast(tensor, root, async_op);
    nlohmann::json obs;
    obs["work"] = FinishWork(work, async_op);
    obs[kTensors]["tensor"] = TensorToJson(tensor);
    return obs;
  };
  s.expect = ExpectBroadcast;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeAgainstExpected(checks, per_rank, ExpectBroadcast(p, world));
    checks.SetFigure("root", ResolveRoot(p.GetInt("root"), world));
  };
  return s;
}

// ---- broadcast_group ------------------------------------------------------------------------

// The group of broadcast_group as the case passes it to new_group: every rank but 0, listed
// from the last down ([world - 1, ..., 1]).
std::vector<int> ListedGroupRanks(int world) {
  std::vector<int> ranks;
  for (int r = world - 1; r >= 1; --r) ranks.push_back(r);
  return ranks;
}

// The int64 tensor global rank `rank` broadcasts in broadcast_group: 100 * rank + i, 3 elements.
std::vector<int64_t> GroupBroadcastValues(int rank) {
  return {100 * rank, 100 * rank + 1, 100 * rank + 2};
}

// c10d's rules: new_group sorts its ranks, so the group's rank r is its r-th smallest global
// rank; a non-member gets no group (dist.get_rank / get_world_size answer -1); a member's
// broadcast from global rank `src` leaves `src`'s tensor on every member.
nlohmann::json ExpectedBroadcastGroup(int world, int rank) {
  std::vector<int> sorted = ListedGroupRanks(world);
  std::sort(sorted.begin(), sorted.end());
  const auto it = std::find(sorted.begin(), sorted.end(), rank);
  nlohmann::json e;
  if (it == sorted.end()) {
    e["group_rank"] = -1;
    e["group_size"] = -1;
    e["group_ranks"] = nullptr;
    e["gathered"] = nullptr;
    e["broadcasts"] = nullptr;
    return e;
  }
  e["group_rank"] = it - sorted.begin();
  e["group_size"] = sorted.size();
  e["group_ranks"] = sorted;
  e["gathered"] = sorted;
  e["broadcasts"] = nlohmann::json::array();
  for (int src : ListedGroupRanks(world)) e["broadcasts"].push_back(GroupBroadcastValues(src));
  return e;
}

Scenario BroadcastGroup() {
  Scenario s;
  s.info = CollectiveInfo(
      "broadcast_group",
      "new_group over every rank but 0, its ranks listed from the last down ([world - 1, ..., "
      "1]): every rank's dist.get_rank(group) and get_world_size(group) (-1 outside it), and on "
      "the members get_process_group_ranks(group), an all-gather of the global rank over it and "
      "a broadcast(tensor, src=g, group) from every member g, in the listed order, of int64 "
      "[100 g, 100 g + 1, 100 g + 2] (every member starts from its own)",
      "distributed_test.py::DistributedTest::test_broadcast_group (with "
      "test_get_rank_size_group), the group's ranks listed unsorted",
      {});
  s.info.min_world = 2;
  s.info.test_runs = {{2, {}}, {3, {}}, {8, {}}};
  s.info.observations.Add(ObservationKey::Integer("group_rank", "dist.get_rank(group)"))
      .Add(ObservationKey::Integer("group_size", "dist.get_world_size(group)"))
      .Add(ObservationKey::Custom(
          "group_ranks", {{"type", {"array", "null"}}},
          "dist.get_process_group_ranks(group) on a member (the global ranks in group-rank "
          "order), null elsewhere"))
      .Add(ObservationKey::Custom(
          "gathered", {{"type", {"array", "null"}}},
          "on a member: all_gather_into_tensor over the group of this rank's global rank "
          "(int64, one element per member); null elsewhere"))
      .Add(ObservationKey::Custom(
          "broadcasts", {{"type", {"array", "null"}}},
          "on a member: for every src of the listed ranks, in that order, the tensor after "
          "broadcast(tensor, src=src, group=group); null elsewhere"));
  s.run_rank = [](RankEnv& env) {
    auto group = env.group().new_group(ListedGroupRanks(env.world));
    nlohmann::json obs;
    obs["group_rank"] = group == nullptr ? -1 : group->rank();
    obs["group_size"] = group == nullptr ? -1 : group->size();
    obs["group_ranks"] = nullptr;
    obs["gathered"] = nullptr;
    obs["broadcasts"] = nullptr;
    if (group == nullptr) return obs;
    obs["group_ranks"] = group->global_ranks();
    const Tensor mine = Tensor::from_int64s({env.rank}, {1}).to(group->default_device());
    Tensor all = Tensor::empty({group->size()}, DType::kInt64, group->default_device());
    group->all_gather_into_tensor(all, mine)->wait();
    obs["gathered"] = all.to(Device::CPU()).to_int64s();
    obs["broadcasts"] = nlohmann::json::array();
    for (int src : ListedGroupRanks(env.world)) {
      Tensor t =
          Tensor::from_int64s(GroupBroadcastValues(env.rank), {3}).to(group->default_device());
      group->broadcast(t, group->group_rank(src))->wait();
      obs["broadcasts"].push_back(t.to(Device::CPU()).to_int64s());
    }
    return obs;
  };
  s.expect = [](const CaseParams&, int world) {
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) out.push_back(ExpectedBroadcastGroup(world, r));
    return out;
  };
  s.judge = [](const CaseParams&, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    for (int r = 0; r < world; ++r) {
      const nlohmann::json expected = ExpectedBroadcastGroup(world, r);
      for (const char* key :
           {"group_rank", "group_size", "group_ranks", "gathered", "broadcasts"}) {
        CheckRankEqual(checks, per_rank, r, {key, key, expected.at(key)});
      }
    }
  };
  return s;
}

// all_gather's per-rank input count: `count`, or count + (rank mod 3) for uneven counts.
int64_t ListCount(const CaseParams& p, int rank) {
  const int64_t count = p.GetInt("count");
  return p.GetString("counts") == "uneven" ? count + rank % 3 : count;
}

std::vector<nlohmann::json> ExpectAllGather(const CaseParams& p, int world) {
  const std::string dtype = p.GetString("dtype");
  nlohmann::json numels = nlohmann::json::array();
  std::vector<double> gathered;
  for (int q = 0; q < world; ++q) {
    numels.push_back(ListCount(p, q));
    const auto values = GatherValues(q, ListCount(p, q));
    gathered.insert(gathered.end(), values.begin(), values.end());
  }
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e["work"] = ExpectedWork(p.GetBool("async_op"));
    e["output_numels"] = numels;
    e[kTensors]["outputs"] = ValuesJson(gathered, dtype);
    if (!p.GetBool("in_place")) {
      e[kTensors]["input"] = ValuesJson(GatherValues(r, ListCount(p, r)), dtype);
    }
  }
  return expected;
}

Scenario AllGather() {
  Scenario s;
  s.info = CollectiveInfo(
      "all_gather",
      "all_gather into a list: outputs[q] of every rank is rank q's input, with equal or "
      "per-rank different counts (in place: outputs[rank] is the input itself)",
      "test_multi_threaded_pg.py::TestCollectivesWithBaseClass::test_allgather",
      {DTypeAxis(),
       ParamSpec::Axis("counts", "uneven: rank r sends count + r mod 3 elements",
                       {"uneven", "equal"}),
       InPlaceAxis("outputs[rank] is the input tensor"), AsyncAxis(),
       CountSize("elements of rank 0 (all ranks when counts=equal)", 5)});
  s.info.observations.Add(WorkKey(/*can_fail=*/false))
      .Add(ObservationKey::IntegerList(
          "output_numels", "outputs[q].numel() for q = 0 .. world - 1 after the call"))
      .AddTensors({"outputs", "the case's dtype", "[sum of output_numels]",
                   "torch.cat(outputs) after all_gather(outputs, input): outputs[q] is rank "
                   "q's input, element i (7q + 3i) mod 251 - 125 (every outputs[q] starts as "
                   "-200; in place, outputs[rank] is the input itself)"})
      .AddTensors(InputTensor("[numel of the rank's input]",
                              "count (+ rank mod 3 for counts=uneven) elements, element i "
                              "(7 * rank + 3i) mod 251 - 125"));
  s.run_rank = [](RankEnv& env) {
    const DType dtype = ParseDType(env.params.GetString("dtype"));
    const bool in_place = env.params.GetBool("in_place");
    const bool async_op = env.params.GetBool("async_op");
    Tensor input =
        MakeTensor(GatherValues(env.rank, ListCount(env.params, env.rank)), dtype, env.device);
    std::vector<Tensor> outputs;
    for (int q = 0; q < env.world; ++q) {
      outputs.push_back(in_place && q == env.rank ? input
                                                  : Tensor::full({ListCount(env.params, q)},
                                                                 kSentinel, dtype, env.device));
    }
    auto work = env.group().all_gather(outputs, input, async_op);
    nlohmann::json obs;
    obs["work"] = FinishWork(work, async_op);
    // outputs[0], outputs[1], ... as one tensor (their values concatenated in rank order)
    // plus each one's numel: one entry instead of `world`, so that world 128 stays cheap.
    std::vector<double> values;
    nlohmann::json numels = nlohmann::json::array();
    for (const Tensor& out : outputs) {
      const std::vector<double> v = out.to_doubles();
      values.insert(values.end(), v.begin(), v.end());
      numels.push_back(out.numel());
    }
    obs["output_numels"] = numels;
    obs[kTensors]["outputs"] = TensorJson({static_cast<int64_t>(values.size())},
                                          DTypeName(outputs.front().dtype()), values);
    if (!in_place) obs[kTensors]["input"] = TensorToJson(input);
    return obs;
  };
  s.expect = ExpectAllGather;
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    JudgeAgainstExpected(checks, per_rank, ExpectAllGather(p, world));
  };
  return s;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The rank that enters barrier `round` late.
int LateRank(int round, int world) { return (world - 1 + round) % world; }

Scenario Barrier() {
  Scenario s;
  s.info = CollectiveInfo("barrier",
                          "barrier: in each round one rank enters delay_ms late (the last rank, "
                          "then rank 0, "
                          "...), and no rank leaves before the last one entered (steady-clock "
                          "times, one host)",
                          "distributed_test.py::_DistTestBase::test_barrier",
                          {ParamSpec::SizeInt("rounds", "barriers in a row", 3, /*minimum=*/1),
                           ParamSpec::SizeInt("delay_ms", "how late the late rank enters", 20)});
  s.info.observations
      .Add(ObservationKey::IntegerList(
          "enter_ns",
          "per round, in order: the steady clock (CLOCK_MONOTONIC, ns) right before "
          "the rank called barrier() (rounds entries)"))
      .Add(ObservationKey::IntegerList(
          "leave_ns",
          "per round, in order: the steady clock (CLOCK_MONOTONIC, ns) right after "
          "barrier() returned (rounds entries)"))
      .Add(ObservationKey::CommCounts(
          "{\"barrier\": {op: n}}: CommDebugMode.get_comm_counts() of a mode active over the "
          "rounds and one all_reduce (SUM) of a 1-element int64 tensor after them"));
  s.run_rank = [](RankEnv& env) {
    const int64_t rounds = env.params.GetInt("rounds");
    const auto delay = std::chrono::milliseconds(env.params.GetInt("delay_ms"));
    nlohmann::json enter = nlohmann::json::array();
    nlohmann::json leave = nlohmann::json::array();
    distributed::CommDebugMode mode;
    for (int64_t k = 0; k < rounds; ++k) {
      if (env.rank == LateRank(static_cast<int>(k), env.world)) std::this_thread::sleep_for(delay);
      enter.push_back(NowNs());
      env.group().barrier();
      leave.push_back(NowNs());
    }
    env.group().all_reduce(MakeTensor({1}, DType::kInt64, env.device));
    mode.exit();
    nlohmann::json obs;
    obs["enter_ns"] = enter;
    obs["leave_ns"] = leave;
    obs[kCommCounts] = {{"barrier", nlohmann::json::object()}};
    for (const auto& [op, n] : mode.get_comm_counts()) obs[kCommCounts]["barrier"][op] = n;
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const int64_t rounds = p.GetInt("rounds");
    double min_wait_ms = -1;
    for (int64_t k = 0; k < rounds; ++k) {
      int64_t last_enter = 0;
      int last_rank = 0;
      for (int r = 0; r < world; ++r) {
        const auto& enter = RankObservation(per_rank, r, "enter_ns");
        FSDP_CHECK_CODE(ErrorCode::kDataLoss, enter.is_array() && enter.size() == size_t(rounds),
                        RankName(r), ": enter_ns must hold ", rounds, " times");
        const int64_t e = enter.at(k).get<int64_t>();
        if (r == 0 || e > last_enter) last_enter = e, last_rank = r;
      }
      for (int r = 0; r < world; ++r) {
        const auto& leave = RankObservation(per_rank, r, "leave_ns");
        FSDP_CHECK_CODE(ErrorCode::kDataLoss, leave.is_array() && leave.size() == size_t(rounds),
                        RankName(r), ": leave_ns must hold ", rounds, " times");
        const int64_t l = leave.at(k).get<int64_t>();
        const double margin_ms = static_cast<double>(l - last_enter) / 1e6;
        checks.CheckTrue(
            "round " + std::to_string(k) + " " + RankName(r) +
                " leaves after the last rank entered",
            l >= last_enter,
            "left " + std::to_string(margin_ms) + " ms after rank " + std::to_string(last_rank) +
                " entered");
        if (r != last_rank && (min_wait_ms < 0 || margin_ms < min_wait_ms)) {
          min_wait_ms = margin_ms;
        }
      }
    }
    if (min_wait_ms >= 0) checks.SetFigure("min_leave_after_last_enter_ms", min_wait_ms);
    // PyTorch's CommDebugMode counts only the c10d and functional collectives of its list
    // (_comm_mode.py, c10d_collective_ops), which has no barrier; the all_reduce counts once.
    const nlohmann::json want = {{"barrier", {{"c10d.allreduce_", 1}}}};
    for (int r = 0; r < world; ++r) {
      checks.CheckEqual(RankName(r) + " comm_counts (barrier not counted)", want,
                        RankObservation(per_rank, r, kCommCounts));
    }
  };
  s.info.test_runs = CollectiveTestRuns(/*fixes_axes=*/false);
  return s;
}

// ---- device_mesh ----------------------------------------------------------------------------

// mesh_shape "2,3,2" -> {2, 3, 2}.
std::vector<int64_t> MeshShape(const CaseParams& p) {
  std::vector<int64_t> shape;
  std::stringstream ss(p.GetString("mesh_shape"));
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto n = ParseInt(item);
    FSDP_CHECK(n && *n >= 1, "mesh_shape: '", item, "' is not a dim size >= 1");
    shape.push_back(*n);
  }
  FSDP_CHECK(!shape.empty(), "mesh_shape must name at least one dim size");
  return shape;
}

int64_t MeshSize(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<std::string> MeshDimNames(size_t ndim) {
  std::vector<std::string> names;
  for (size_t d = 0; d < ndim; ++d) names.push_back("dim" + std::to_string(d));
  return names;
}

// The sub-meshes each rank reports: every single dim, then every two adjacent dims, each as
// its dim indices.
std::vector<std::vector<size_t>> SubMeshDims(size_t ndim) {
  std::vector<std::vector<size_t>> out;
  for (size_t d = 0; d < ndim; ++d) out.push_back({d});
  for (size_t d = 0; d + 1 < ndim; ++d) out.push_back({d, d + 1});
  return out;
}

std::string SubMeshKey(const std::vector<std::string>& names, const std::vector<size_t>& dims) {
  std::string key;
  for (size_t d : dims) key += (key.empty() ? "" : ",") + names[d];
  return key;
}

// mesh_ranks "0,2" -> {0, 2}; "all" -> arange(world) (init_device_mesh).
std::vector<int> MeshRanks(const CaseParams& p, int world) {
  std::vector<int> ranks;
  const std::string spec = p.GetString("mesh_ranks");
  if (spec == "all") {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    return ranks;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto n = ParseInt(item);
    FSDP_CHECK(n && *n >= 0, "mesh_ranks: '", item, "' is not a global rank");
    ranks.push_back(static_cast<int>(*n));
  }
  return ranks;
}

// The mesh is `ranks` laid out row-major in `shape` (init_device_mesh: arange(world)); a member's
// coordinate is its index in `ranks` unravelled; the sub-mesh over `dims` holds, in row-major
// order over those dims, the ranks whose coordinate equals this rank's on every other dim; a
// dim's group is the sub-mesh of that dim alone, in group-rank order (c10d's new_group sorts a
// group's ranks; `ranks` ascend, so every line of the mesh does too). A rank outside the mesh
// has no coordinate and reads nothing of it: every key null.
nlohmann::json ExpectedDeviceMesh(const std::vector<int64_t>& shape, const std::vector<int>& ranks,
                                  int rank) {
  const auto at = std::find(ranks.begin(), ranks.end(), rank);
  if (at == ranks.end()) {
    return {{"coordinate", nullptr},
            {"local_ranks", nullptr},
            {"group_ranks", nullptr},
            {"gathered", nullptr},
            {"sub_meshes", nullptr}};
  }
  const size_t ndim = shape.size();
  std::vector<int64_t> coord(ndim);
  int64_t rest = at - ranks.begin();
  for (size_t d = ndim; d-- > 0;) {
    coord[d] = rest % shape[d];
    rest /= shape[d];
  }
  auto rank_at = [&](const std::vector<int64_t>& c) {
    int64_t f = 0;
    for (size_t d = 0; d < ndim; ++d) f = f * shape[d] + c[d];
    return ranks[static_cast<size_t>(f)];
  };
  auto sub_ranks = [&](const std::vector<size_t>& dims) {
    nlohmann::json out = nlohmann::json::array();
    std::vector<int64_t> sub_shape;
    for (size_t d : dims) sub_shape.push_back(shape[d]);
    for (int64_t i = 0; i < MeshSize(sub_shape); ++i) {
      std::vector<int64_t> c = coord;
      int64_t r = i;
      for (size_t k = dims.size(); k-- > 0;) {
        c[dims[k]] = r % sub_shape[k];
        r /= sub_shape[k];
      }
      out.push_back(rank_at(c));
    }
    return out;
  };
  const std::vector<std::string> names = MeshDimNames(ndim);
  nlohmann::json obs;
  obs["coordinate"] = coord;
  obs["local_ranks"] = coord;
  obs["group_ranks"] = nlohmann::json::array();
  for (size_t d = 0; d < ndim; ++d) obs["group_ranks"].push_back(sub_ranks({d}));
  obs["gathered"] = obs["group_ranks"];
  obs["sub_meshes"] = nlohmann::json::object();
  for (const auto& dims : SubMeshDims(ndim)) {
    nlohmann::json sub_coord = nlohmann::json::array();
    for (size_t d : dims) sub_coord.push_back(coord[d]);
    obs["sub_meshes"][SubMeshKey(names, dims)] = {{"ranks", sub_ranks(dims)},
                                                  {"coordinate", sub_coord}};
  }
  return obs;
}

// Why the case cannot run (mesh_shape and mesh_ranks against the world), or nullopt.
std::optional<std::string> DeviceMeshSkip(const CaseParams& p, int world) {
  const std::vector<int64_t> shape = MeshShape(p);
  const int64_t n = MeshSize(shape);
  if (p.GetString("mesh_ranks") == "all") {
    if (n == world) return std::nullopt;
    return "mesh_shape " + p.GetString("mesh_shape") + " has " + std::to_string(n) +
           " ranks, not the world size " + std::to_string(world);
  }
  const std::vector<int> ranks = MeshRanks(p, world);
  if (static_cast<int64_t>(ranks.size()) != n) {
    return "mesh_ranks " + p.GetString("mesh_ranks") + " are not the " + std::to_string(n) +
           " ranks of mesh_shape " + p.GetString("mesh_shape");
  }
  if (ranks.back() >= world) {
    return "mesh_ranks " + p.GetString("mesh_ranks") + " name a rank outside the world of " +
           std::to_string(world);
  }
  if (!std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    // PyTorch's get_local_rank is the rank within the dim's group, whose ranks new_group sorts,
    // so for an unsorted line it differs from the coordinate; the suite takes ascending lists.
    return "mesh_ranks " + p.GetString("mesh_ranks") + " do not ascend";
  }
  return std::nullopt;
}

Scenario DeviceMeshScenario() {
  Scenario s;
  s.info = CollectiveInfo(
      "device_mesh",
      "init_device_mesh(mesh_shape, mesh_dim_names=(dim0, dim1, ...)) over the world, or "
      "DeviceMesh(device, mesh_ranks reshaped to mesh_shape) over a subset of it: every rank's "
      "coordinate and local rank per dim, each dim's group (its ranks, and an all-gather of the "
      "global rank over it), and the sub-meshes of single and adjacent dims (their ranks and "
      "coordinate), against the ranks laid out row-major; a rank outside the mesh reads nothing",
      "test_device_mesh.py::TestDeviceMeshGetItem::test_get_item_3d (and "
      "TestDeviceMesh::test_get_local_rank_3d, test_get_group_and_get_all_groups); "
      "test_dtensor.py::DTensorTest::test_redistribute_sub_mesh (DeviceMesh(device, [0, 2]) at "
      "world 4)",
      {ParamSpec::SizeString("mesh_shape",
                             "comma-separated dim sizes; their product must be the world size "
                             "(dims of different sizes tell a transposed layout apart)",
                             "2,3,2"),
       ParamSpec::SizeString("mesh_ranks",
                             "comma-separated ascending global ranks, row-major in mesh_shape: "
                             "DeviceMesh(device, tensor(mesh_ranks).reshape(mesh_shape)), whose "
                             "ranks may be a subset of the world; all: init_device_mesh over "
                             "the world",
                             "all")});
  s.info.default_world = 12;
  // A 1-D mesh over half the world (test_redistribute_sub_mesh's): its group must be a new
  // group of its ranks, not the world's, which only a mesh over the whole world may reuse.
  s.info.extra_default_runs = {{4, {{"mesh_shape", "2"}, {"mesh_ranks", "0,2"}}}};
  s.info.test_runs = {{8, {{"mesh_shape", "2,2,2"}}},
                      {6, {{"mesh_shape", "3,2"}}},
                      {4, {{"mesh_shape", "4"}}},
                      {6, {{"mesh_shape", "1,2,3"}}},
                      {8, {{"mesh_shape", "2,2"}, {"mesh_ranks", "1,3,5,7"}}}};
  const nlohmann::json array_or_null = {{"type", {"array", "null"}}};
  s.info.observations
      .Add(ObservationKey::Custom("coordinate", array_or_null,
                                  "mesh.get_coordinate() (null outside the mesh)"))
      .Add(ObservationKey::Custom(
          "local_ranks", array_or_null,
          "mesh.get_local_rank(name) for every dim name, in order (null outside the mesh)"))
      .Add(ObservationKey::Custom(
          "group_ranks", {{"type", {"array", "null"}}, {"items", {{"type", "array"}}}},
          "for every dim name, in order: the global ranks of mesh.get_group(name) in group-rank "
          "order (dist.get_process_group_ranks); null outside the mesh"))
      .Add(ObservationKey::Custom(
          "gathered", {{"type", {"array", "null"}}, {"items", {{"type", {"array", "null"}}}}},
          "for every dim name, in order: all_gather_into_tensor over mesh.get_group(name) of "
          "this rank's global rank (int64, one element per rank); null for a group whose ranks "
          "are not the mesh's line through this rank (a collective over it would wait for "
          "ranks that never join); null outside the mesh"))
      .Add(ObservationKey::Custom(
          "sub_meshes", {{"type", {"object", "null"}}},
          "for every single dim and every two adjacent dims (key: the names joined by \",\"): "
          "{\"ranks\": mesh[names].mesh flattened row-major, \"coordinate\": "
          "mesh[names].get_coordinate()}; null outside the mesh"));
  s.skip = DeviceMeshSkip;
  s.run_rank = [](RankEnv& env) {
    const std::vector<int64_t> shape = MeshShape(env.params);
    const std::vector<std::string> names = MeshDimNames(shape.size());
    const std::string device = env.device.is_cuda() ? "cuda" : "cpu";
    auto mesh = env.params.GetString("mesh_ranks") == "all"
                    ? distributed::DeviceMesh::Init(env.pg, device, shape, names)
                    : distributed::DeviceMesh::Create(env.pg, device, shape,
                                                      MeshRanks(env.params, env.world), names);
    const auto coordinate = mesh->get_coordinate();
    if (!coordinate.has_value()) {
      return ExpectedDeviceMesh(shape, {}, env.rank);  // outside the mesh: every key null
    }
    nlohmann::json obs;
    obs["coordinate"] = *coordinate;
    obs["local_ranks"] = nlohmann::json::array();
    obs["group_ranks"] = nlohmann::json::array();
    obs["gathered"] = nlohmann::json::array();
    for (const std::string& name : names) {
      obs["local_ranks"].push_back(mesh->get_local_rank(name));
      distributed::ProcessGroup& group = *mesh->get_group(name);
      obs["group_ranks"].push_back(group.global_ranks());
      std::vector<int> line = mesh->slice({name})->mesh();
      std::sort(line.begin(), line.end());
      if (group.global_ranks() != line) {
        obs["gathered"].push_back(nullptr);
        continue;
      }
      const Tensor mine = Tensor::from_int64s({env.rank}, {1}).to(group.default_device());
      Tensor all = Tensor::empty({group.size()}, DType::kInt64, group.default_device());
      group.all_gather_into_tensor(all, mine)->wait();
      obs["gathered"].push_back(all.to(Device::CPU()).to_int64s());
    }
    obs["sub_meshes"] = nlohmann::json::object();
    for (const auto& dims : SubMeshDims(shape.size())) {
      std::vector<std::string> sub_names;
      for (size_t d : dims) sub_names.push_back(names[d]);
      auto sub = mesh->slice(sub_names);
      obs["sub_meshes"][SubMeshKey(names, dims)] = {{"ranks", sub->mesh()},
                                                    {"coordinate", *sub->get_coordinate()}};
    }
    return obs;
  };
  s.expect = [](const CaseParams& p, int world) {
    std::vector<nlohmann::json> out;
    for (int r = 0; r < world; ++r) {
      out.push_back(ExpectedDeviceMesh(MeshShape(p), MeshRanks(p, world), r));
    }
    return out;
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const std::vector<nlohmann::json> expected = expect(p, world);
    for (int r = 0; r < world; ++r) {
      for (const char* key :
           {"coordinate", "local_ranks", "group_ranks", "gathered", "sub_meshes"}) {
        CheckRankEqual(checks, per_rank, r, {key, key, expected[static_cast<size_t>(r)].at(key)});
      }
    }
  };
  return s;
}

}  // namespace

void RegisterCollectivesScenarios(ScenarioRegistry& registry) {
  registry.Add(AllGatherIntoTensor());
  registry.Add(ReduceScatterTensor());
  registry.Add(AllReduce());
  registry.Add(Broadcast());
  registry.Add(BroadcastGroup());
  registry.Add(AllGather());
  registry.Add(Barrier());
  registry.Add(DeviceMeshScenario());
}

}  // namespace fsdp::conformance
