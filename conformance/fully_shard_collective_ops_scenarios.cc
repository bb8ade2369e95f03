// Family `fully_shard_comm`, the TestFullyShardCollectiveOps part (seed 000, 128 ranks by
// default; any backend, e.g. gloo at small worlds):
//   all_gather_fp32       test_all_gather_fp32
//   reduce_scatter_fp32   test_reduce_scatter_fp32
//   reduce_scatter_fp16   test_reduce_scatter_fp16
// Each rank builds the seed's `_init_fsdp_param_group`: an nn.ParameterList of clones of the
// eight `_get_param_sizes` parameters (randn from one seed, identical on every rank as the
// seed's broadcast from rank 0 makes them) and one FsdpParamGroup over the world group, then
// drives foreach_all_gather / foreach_reduce directly.
//
// all_gather_fp32: every sharded parameter's full_tensor() and every all-gathered unsharded
// parameter equal the originals bit for bit; with an int reshard_after_forward the group is
// resharded to the post-forward mesh and all-gathered again over it (the int is the post-
// forward group size, so it must divide the world size).
// reduce_scatter_*: gradients are reduce-scattered in the reduce dtype; every rank's sharded
// gradient's full_tensor() must equal the seed's reference reduction (clone, pre-divide,
// all_reduce AVG or SUM, post-divide), every rank's own shard must equal the average the judge
// derives by rule, and the divide factors must follow docs/fsdp-behaviour.md, "Gradient divide
// factors", which the judge recomputes from the world size. The seed's gradients are
// ones * rank: equal elements (a shard delivered to the wrong rank would pass) and a zero
// contribution from rank 0 (a lost rank 0 would pass). Here element e of parameter p on rank r
// is ReduceInput({world, padded shard numel of p}, r, e) ([Note: exact collective data],
// collective_data.h): shards differ, every rank counts, and every result is exact.
//
// The stream axes select the CommContext's dedicated streams or the current stream. On the
// CPU backends streams only order work (every collective completes in order), so those cases
// must give the same results; on CUDA they are real streams.
#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/collective_data.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/distributed/reduce_op.h"
#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fsdp_collectives.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/nn/layers.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeedClass = "test_fully_shard_comm.py::TestFullyShardCollectiveOps::";
constexpr const char* kSeedParamSizes = "17x257,17,64x312,64,64x64,512x64,256,64x297";

// "17x257,17" -> {{17, 257}, {17}}; InvalidArgument naming the bad entry.
std::vector<Shape> ParseShapes(const std::string& text) {
  std::vector<Shape> shapes;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, end - start);
    Shape shape;
    size_t pos = 0;
    while (pos <= entry.size()) {
      const size_t x = std::min(entry.find('x', pos), entry.size());
      const std::string dim = entry.substr(pos, x - pos);
      bool digits = !dim.empty() && dim.size() <= 9;
      for (char c : dim) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
      FSDP_CHECK(digits, "param_sizes: '", entry, "' is not a shape like 17x257 (in '", text, "')");
      shape.push_back(std::stoll(dim));
      pos = x + 1;
    }
    shapes.push_back(shape);
    start = end + 1;
  }
  return shapes;
}

// `_init_params` + `_init_fsdp_param_group`.
struct SeedGroup {
  std::vector<Tensor> orig_params;
  std::shared_ptr<nn::ParameterList> module;
  std::shared_ptr<fsdp2::FsdpParamGroup> group;
};

SeedGroup MakeSeedGroup(const RankEnv& env, fsdp2::ReshardAfterForward reshard_after_forward) {
  SeedGroup g;
  Generator generator(static_cast<uint64_t>(env.params.GetInt("seed")));
  std::vector<Tensor> clones;
  for (const Shape& shape : ParseShapes(env.params.GetString("param_sizes"))) {
    g.orig_params.push_back(Tensor::randn(shape, DType::kFloat32, &generator));
    clones.push_back(g.orig_params.back().clone());
  }
  g.module = std::make_shared<nn::ParameterList>(clones);
  const fsdp2::FsdpMeshInfo mesh_info = fsdp2::FsdpMeshInfo::FromProcessGroup(env.pg);
  std::vector<fsdp2::ParamToShard> to_shard;
  for (size_t i = 0; i < clones.size(); ++i) {
    to_shard.push_back({clones[i], {g.module.get(), std::to_string(i), {}, {}}});
  }
  g.group = std::make_shared<fsdp2::FsdpParamGroup>(
      std::move(to_shard), g.module.get(), mesh_info,
      fsdp2::GetPostForwardMeshInfo(reshard_after_forward, mesh_info), env.device,
      fsdp2::MixedPrecisionPolicy{}, fsdp2::OffloadPolicy{});
  g.group->lazy_init();
  return g;
}

// Elements of `actual` that differ from `expected` (bitwise, as doubles); a shape mismatch
// counts every element.
int64_t Mismatches(const Tensor& expected, const Tensor& actual) {
  if (!actual.defined() || expected.sizes() != actual.sizes()) return expected.numel();
  const std::vector<double> e = expected.to_doubles();
  const std::vector<double> a = actual.to_doubles();
  int64_t n = 0;
  for (size_t i = 0; i < e.size(); ++i) n += e[i] == a[i] ? 0 : 1;
  return n;
}

// The parameters and worlds every TestFullyShardCollectiveOps scenario shares: the seed's
// shapes and seed, the seed's 128 ranks by default. Nothing reaches into an in-process world,
// so every backend runs them.
void AddSeedGroupInfo(ScenarioInfo& info) {
  info.params.push_back(ParamSpec::SizeString(
      "param_sizes", "parameter shapes, comma separated (_get_param_sizes)", kSeedParamSizes));
  info.params.push_back(ParamSpec::SizeInt("seed", "seed of the randn parameters", 42));
  info.default_world = 128;
  info.min_world = 1;
  info.max_world = 128;
  // ctest: also the smallest worlds (as the gloo backend does, tools/CMakeLists.txt).
  info.test_runs = {{2, {}}, {3, {}}};
}

// ---- all_gather_fp32 --------------------------------------------------------------------------

// The seed's `all_gather` helper over `pg`.
void AllGather(fsdp2::FsdpParamGroup& group, const std::shared_ptr<distributed::ProcessGroup>& pg,
               bool async_op, bool separate_streams, fsdp2::CommContext& ctx) {
  fsdp2::CommStream& copy_in = separate_streams ? ctx.all_gather_copy_in_stream() : ctx.current_stream();
  fsdp2::CommStream& gather = separate_streams ? ctx.all_gather_stream() : ctx.current_stream();
  auto result = fsdp2::foreach_all_gather(group.fsdp_param_ptrs(), pg, async_op, copy_in, gather,
                                          group.device());
  fsdp2::foreach_all_gather_copy_out(*result, group.fsdp_param_ptrs(), pg);
  for (fsdp2::FsdpParam* p : group.fsdp_param_ptrs()) p->init_unsharded_param();
  group.to_unsharded();
}

// Per parameter: elements of the module's (unsharded) parameter that differ from the original.
std::vector<int64_t> UnshardedMismatches(const SeedGroup& g) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < g.orig_params.size(); ++i) {
    out.push_back(Mismatches(g.orig_params[i], g.module->parameter(std::to_string(i))));
  }
  return out;
}

nlohmann::json AllGatherRank(RankEnv& env) {
  const std::string raf = env.params.GetString("reshard_after_forward");
  const bool async_op = env.params.GetBool("async_op");
  const bool separate = env.params.GetString("streams") == "separate";
  const fsdp2::ReshardAfterForward reshard_after_forward =
      raf == "True" ? fsdp2::ReshardAfterForward(true)
                    : fsdp2::ReshardAfterForward(static_cast<int>(env.params.GetInt("post_forward_size")));
  SeedGroup g = MakeSeedGroup(env, reshard_after_forward);
  nlohmann::json obs;
  // The sharded parameters are registered on the module, and full_tensor() restores them.
  std::vector<int64_t> sharded_registered;
  std::vector<int64_t> full_tensor_mismatches;
  for (size_t i = 0; i < g.orig_params.size(); ++i) {
    const fsdp2::FsdpParam& p = *g.group->fsdp_params()[i];
    sharded_registered.push_back(
        g.module->parameter(std::to_string(i)).is_same(p.sharded_param()) ? 1 : 0);
    full_tensor_mismatches.push_back(Mismatches(g.orig_params[i], p.full_tensor()));
  }
  obs["sharded_param_registered"] = sharded_registered;
  obs["full_tensor_mismatches"] = full_tensor_mismatches;
  fsdp2::CommContext ctx;
  AllGather(*g.group, g.group->mesh_info().shard_process_group, async_op, separate, ctx);
  obs["unsharded_mismatches"] = UnshardedMismatches(g);
  if (std::holds_alternative<int>(reshard_after_forward)) {
    g.group->to_sharded_post_forward();
    const auto& post = g.group->post_forward_mesh_info();
    FSDP_CHECK(post.has_value(), "int reshard_after_forward left no post-forward mesh");
    obs["post_forward_group_size"] = post->shard_process_group->size();
    AllGather(*g.group, post->shard_process_group, async_op, separate, ctx);
    obs["post_forward_unsharded_mismatches"] = UnshardedMismatches(g);
  }
  return obs;
}

Scenario AllGatherFp32() {
  Scenario s;
  s.info.name = "fully_shard_comm/all_gather_fp32";
  s.info.description =
      "FsdpParamGroup over the seed's 8 parameter shapes: foreach_all_gather + copy-out "
      "restores every parameter bit for bit, also over the post-forward mesh of an int "
      "reshard_after_forward";
  s.info.seed_test = std::string(kSeedClass) + "test_all_gather_fp32";
  s.info.params = {
      ParamSpec::Axis("async_op", "foreach_all_gather async_op", {"False", "True"}),
      ParamSpec::Axis("streams", "(copy-in, all-gather) streams: the current stream for both, "
                      "or the CommContext's dedicated pair", {"default", "separate"}),
      ParamSpec::Axis("reshard_after_forward", "True, or the int post_forward_size", {"True", "int"}),
      ParamSpec::SizeInt("post_forward_size", "the int reshard_after_forward (post-forward group size)", 8),
  };
  AddSeedGroupInfo(s.info);
  // At the small worlds of ctest, the int reshard_after_forward groups the whole world.
  for (TestRun& run : s.info.test_runs) run.params["post_forward_size"] = std::to_string(run.world);
  // The seed skips an int reshard_after_forward with async_op or the default streams.
  s.excluded = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (p.GetString("reshard_after_forward") == "int" &&
        (p.GetBool("async_op") || p.GetString("streams") == "default")) {
      return "int reshard_after_forward runs only synchronously on separate streams (seed)";
    }
    return std::nullopt;
  };
  s.skip = [](const CaseParams& p, int world) -> std::optional<std::string> {
    const int64_t k = p.GetInt("post_forward_size");
    if (p.GetString("reshard_after_forward") == "int" && (k < 1 || world % k != 0)) {
      return "post_forward_size " + std::to_string(k) + " does not divide world size " +
             std::to_string(world);
    }
    return std::nullopt;
  };
  s.run_rank = AllGatherRank;
  s.judge = [](const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const size_t n = ParseShapes(params.GetString("param_sizes")).size();
    const nlohmann::json zeros = std::vector<int64_t>(n, 0);
    const nlohmann::json ones = std::vector<int64_t>(n, 1);
    const bool int_raf = params.GetString("reshard_after_forward") == "int";
    std::vector<RankCheck> rank_checks = {
        {"sharded_param_registered", "sharded parameters registered on the module", ones},
        {"full_tensor_mismatches", "full_tensor() elements differing from the originals", zeros},
        {"unsharded_mismatches", "all-gathered elements differing from the originals", zeros}};
    if (int_raf) {
      rank_checks.push_back({"post_forward_group_size", "post-forward group size",
                             params.GetInt("post_forward_size")});
      rank_checks.push_back({"post_forward_unsharded_mismatches",
                             "post-forward all-gathered elements differing from the originals",
                             zeros});
    }
    CheckEveryRank(checks, per_rank, world, rank_checks);
  };
  return s;
}

// ---- reduce_scatter_fp32 / reduce_scatter_fp16 -------------------------------------------------

const char* DivideOpName(fsdp2::DivideFactors::Op op) {
  switch (op) {
    case fsdp2::DivideFactors::Op::kAvg: return "AVG";
    case fsdp2::DivideFactors::Op::kSum: return "SUM";
    case fsdp2::DivideFactors::Op::kPremulSum: return "PREMUL_SUM";
  }
  return "?";
}

// torch.chunk's dim-0 split of a parameter of `dim0` rows over `world` ranks, as FSDP2 shards:
// every rank's padded shard has `chunk_rows` rows, rank r owns `rows` rows from `row_begin`.
struct Dim0Chunk {
  int64_t chunk_rows = 0;
  int64_t row_begin = 0;
  int64_t rows = 0;
};

Dim0Chunk ChunkOf(int64_t dim0, int rank, int world) {
  Dim0Chunk c;
  c.chunk_rows = (dim0 + world - 1) / world;
  c.row_begin = std::min(dim0, rank * c.chunk_rows);
  c.rows = std::min(dim0, c.row_begin + c.chunk_rows) - c.row_begin;
  return c;
}

int64_t RowNumel(const Shape& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

// The gradients' layout for parameter `shape`: one chunk per rank's padded shard.
ReduceLayout GradLayout(const Shape& shape, int world) {
  return {world, std::max<int64_t>(1, ChunkOf(shape[0], 0, world).chunk_rows * RowNumel(shape))};
}

// The name of parameter i's sharded gradient in `tensors`.
std::string GradName(size_t i) { return "grad." + std::to_string(i); }

// `grad` divided by `factor` in its own dtype (`_div_if_needed`; 1 is a no-op).
Tensor DivIfNeeded(const Tensor& grad, double factor) {
  if (factor == 1.0) return grad;
  std::vector<double> v = grad.to_doubles();
  for (double& x : v) x /= factor;
  return Tensor::from_doubles(v, grad.sizes(), grad.dtype());
}

nlohmann::json ReduceScatterRank(RankEnv& env, DType reduce_dtype) {
  SeedGroup g = MakeSeedGroup(env, true);
  fsdp2::CommContext ctx;
  g.group->unshard();
  g.group->wait_for_unshard();
  g.group->reshard();
  std::vector<Tensor> unsharded_grads;
  for (const Tensor& p : g.orig_params) {
    unsharded_grads.push_back(Tensor::from_doubles(
        ReduceInputs(GradLayout(p.sizes(), env.world), env.rank, 0, p.numel()), p.sizes(),
        p.dtype(), p.device()));
  }
  fsdp2::ForeachReduceOptions options;
  options.orig_dtype = g.orig_params[0].dtype();
  options.reduce_dtype = reduce_dtype;
  options.device = env.device;
  const bool separate = env.params.GetString("reduce_scatter_stream") == "separate";
  options.reduce_scatter_stream = separate ? &ctx.reduce_scatter_stream() : &ctx.current_stream();
  const fsdp2::ForeachReduceResult result = fsdp2::foreach_reduce(
      g.group->fsdp_param_ptrs(), unsharded_grads, g.group->mesh_info().shard_process_group, options);
  // The seed's reference: clone, pre-divide, all_reduce (AVG without a pre-divide factor,
  // else SUM), post-divide, in the reduce dtype.
  const fsdp2::DivideFactors& f = result.divide_factors;
  nlohmann::json obs;
  obs["divide_op"] = DivideOpName(f.op);
  obs["pre_divide"] = f.pre_divide;
  obs["post_divide"] = f.post_divide;
  std::vector<int64_t> mismatches;
  for (size_t i = 0; i < g.orig_params.size(); ++i) {
    Tensor reduced = DivIfNeeded(unsharded_grads[i].to(reduce_dtype), f.pre_divide);
    env.group().all_reduce(reduced, f.op == fsdp2::DivideFactors::Op::kAvg ? distributed::Avg() : distributed::Sum());
    reduced = DivIfNeeded(reduced, f.post_divide).to(options.orig_dtype);
    const fsdp2::FsdpParam& p = *g.group->fsdp_params()[i];
    mismatches.push_back(Mismatches(reduced, p.full_grad()));
    const Tensor sharded_grad = p.sharded_param().grad();
    FSDP_CHECK_CODE(ErrorCode::kInternal, sharded_grad.defined(), "parameter ", i,
                    " has no sharded gradient after foreach_reduce");
    obs[kTensors][GradName(i)] = TensorToJson(sharded_grad);
  }
  obs["full_grad_mismatches"] = mismatches;
  return obs;
}

Scenario ReduceScatter(const std::string& test, DType reduce_dtype) {
  Scenario s;
  s.info.name = "fully_shard_comm/" + test;
  s.info.description =
      std::string("foreach_reduce of exact per-rank gradients over the seed's 8 parameter shapes "
                  "in ") +
      DTypeName(reduce_dtype) +
      ": every sharded gradient's full_tensor() equals the seed's all_reduce reference and "
      "every rank's shard the average by rule, with the divide factors of "
      "docs/fsdp-behaviour.md, \"Gradient divide factors\"";
  s.info.seed_test = std::string(kSeedClass) + "test_" + test;
  s.info.params = {
      ParamSpec::Axis("reduce_scatter_stream", "the current stream or the CommContext's",
                      {"default", "separate"}),
  };
  AddSeedGroupInfo(s.info);
  s.run_rank = [reduce_dtype](RankEnv& env) { return ReduceScatterRank(env, reduce_dtype); };
  s.judge = [reduce_dtype](const CaseParams& params, int world,
                           const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    // The rule, recomputed here: f32/bf16 reduce with AVG; f16 sums with the factor world
    // split into pre * post (pre doubles while it divides world and world / pre > pre).
    const std::vector<Shape> shapes = ParseShapes(params.GetString("param_sizes"));
    const size_t n = shapes.size();
    std::string op = "AVG";
    double pre = 1.0;
    double post = 1.0;
    if (reduce_dtype == DType::kFloat16 && world > 1) {
      op = "SUM";
      pre = 1.0;
      // _get_gradient_divide_factors' loop, quirk included: it tests the current factor, so
      // world 3 gives pre 2, post 1.5.
      while (static_cast<int64_t>(world) % static_cast<int64_t>(pre) == 0 && world / pre > pre) {
        pre *= 2;
      }
      post = world / pre;
    }
    for (int r = 0; r < world; ++r) {
      const std::string who = RankName(r);
      if (world > 1) {
        CheckRankEqual(checks, per_rank, r, {"divide_op", "divide op", op});
        checks.CheckEqual(who + " pre/post divide factors", nlohmann::json({pre, post}),
                          nlohmann::json({RankObservation(per_rank, r, "pre_divide"),
                                          RankObservation(per_rank, r, "post_divide")}));
      }
      CheckRankEqual(checks, per_rank, r,
                     {"full_grad_mismatches",
                      "elements of full_tensor(grad) differing from the reference",
                      std::vector<int64_t>(n, 0)});
      // This rank's rows of every parameter: the average of every rank's gradient, exact.
      for (size_t i = 0; i < n; ++i) {
        const Dim0Chunk chunk = ChunkOf(shapes[i][0], r, world);
        const int64_t row_numel = RowNumel(shapes[i]);
        Shape sharded_shape = shapes[i];
        sharded_shape[0] = chunk.rows;
        checks.CheckEqual(who + " " + GradName(i) + " shape", nlohmann::json(sharded_shape),
                          nlohmann::json(TensorShape(per_rank, r, GradName(i))));
        checks.CheckClose(who + " " + GradName(i) + " = average of the ranks' gradients",
                          ExpectedReductions(distributed::ReduceOp::kAvg,
                                             GradLayout(shapes[i], world),
                                             chunk.row_begin * row_numel, chunk.rows * row_numel),
                          TensorData(per_rank, r, GradName(i)), Tolerance{0, 0});
      }
    }
  };
  return s;
}

}  // namespace

void RegisterFullyShardCollectiveOpsScenarios(ScenarioRegistry& registry) {
  registry.Add(AllGatherFp32());
  registry.Add(ReduceScatter("reduce_scatter_fp32", DType::kFloat32));
  registry.Add(ReduceScatter("reduce_scatter_fp16", DType::kFloat16));
}

}  // namespace fsdp::conformance
