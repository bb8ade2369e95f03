// Family `fsdp_state_dict` (seed 001, test_fsdp_state_dict.py): FSDP1 state dicts.
//
// The round-trip scenarios share one body: each rank builds the case's model
// (fsdp_state_dict_models.h) from the runner-owned weights, wraps it as the seed does, saves
// its state dict under the case's `state_dict_type` and config, reports the saved dict raw
// (keys in order, every value, the global shape and offsets of every sharded entry), then
// builds the same model again with every parameter and buffer zeroed (the seed's
// `_zero_model(zero_buffers=True)`), loads the saved dict (strict) under the same type and
// reports the loaded model's parameters and persistent buffers (summon_full_params, clean
// FQNs). With `state_dict_rank0_and_offload` the saved dict is broadcast from rank 0 first
// (the seed's `_broadcast_state_dict`); with `through_file` it goes through the project's
// file format (safetensors bytes, sharding in the metadata: the seed's torch.save/torch.load).
//
// The judge derives every expectation from the weights and the rules of docs/fsdp1.md
// ("State dicts"): FULL keys are the plain model's keys (as a set) with its values, nothing on
// ranks other than 0 with rank0_only; SHARDED the same keys, parameters as their torch.chunk
// dim-0 pieces at offsets (row_begin, 0, ...); LOCAL one `<instance>._flat_param` per FSDP
// instance, the unpadded piece [c*r, min((c+1)*r, N)) of the instance's flat parameter (its
// parameters in the plain model's order, tied ones once, concatenated) at offset c*r, c =
// ceil(N / W), plus the buffers; at a world size of 1 (NO_SHARD) every type saves a FULL dict.
// Values are exact copies (float32 even under float16 mixed precision); after the load the
// model holds exactly the weights.
//
// The other scenarios have bodies of their own: wrong_state_dict_config (the error text),
// state_dict_type (every instance's type inside and after the scope),
// full_state_dict_missing_unexpected_keys_cleaned (strict=False's key lists),
// state_dict_rank0_offload_save_load_flow (sync_module_states), local_state_dict_reshard
// (world -> 2 ranks), state_dict_save_load_flow (against DistributedDataParallel),
// save_and_load_after_forward_state_dict (after training) and
// state_dict_with_ignored_modules (uncopied ignored tensors and buffers).
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/fsdp1_params.h"
#include "conformance/fsdp_state_dict_models.h"
#include "conformance/model_zoo.h"
#include "conformance/observations.h"
#include "conformance/rank_checks.h"
#include "conformance/scenario_registry.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/ddp/distributed_data_parallel.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/state_dict_type.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/init.h"
#include "engine/optim/sgd.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kSeed001 = "test_fsdp_state_dict.py::TestFSDPStateDict::";
constexpr const char* kSaved = "saved/";
constexpr const char* kLoaded = "loaded/";
constexpr const char* kShardingMetadata = "fsdp_state_dict.sharded";

// The seed's state_dict_type names.
fsdp1::StateDictType ParseStateDictType(const std::string& name) {
  if (name == "state_dict") return fsdp1::StateDictType::kFullStateDict;
  if (name == "sharded_state_dict") return fsdp1::StateDictType::kShardedStateDict;
  if (name == "local_state_dict") return fsdp1::StateDictType::kLocalStateDict;
  FSDP_THROW(ErrorCode::kInvalidArgument,
             "state_dict_type must be state_dict, sharded_state_dict or local_state_dict, got '",
             name, "'");
}

// A round-trip case's parameters, decoded once.
struct RoundTripCase {
  std::string model;
  fsdp1::StateDictType type = fsdp1::StateDictType::kFullStateDict;
  bool rank0_and_offload = false;
  bool cpu_offload = false;
  bool mixed_precision = false;
  bool use_orig_params = false;
  std::string source_checkpoint;  // StateDictModelOptions::checkpoint of the saving model
  std::string dest_checkpoint;    // ... and of the loading model
  bool through_file = false;
  bool load_cpu = false;
  bool per_rank_groups = false;  // every rank wraps over its own 1-rank group
  bool load_into_local = false;  // load into the plain model (the seed's local module)
  uint64_t seed = 0;

  static RoundTripCase Decode(const CaseParams& p) {
    RoundTripCase c;
    c.model = p.GetString("model");
    c.type = ParseStateDictType(p.GetString("state_dict_type"));
    c.rank0_and_offload = p.GetBool("state_dict_rank0_and_offload");
    c.cpu_offload = p.GetBool("cpu_offload");
    c.mixed_precision = p.GetBool("mixed_precision");
    c.use_orig_params = p.GetBool("use_orig_params");
    // The seed's checkpoint_wrap: source, dest, both, source_after_wrap, both_after_wrap.
    const std::string wrap = p.GetString("checkpoint_wrap");
    FSDP_CHECK(wrap == "none" || wrap == "source" || wrap == "dest" || wrap == "both" ||
                   wrap == "source_after_wrap" || wrap == "both_after_wrap",
               "checkpoint_wrap must be none, source, dest, both, source_after_wrap or "
               "both_after_wrap, got '", wrap, "'");
    if (wrap == "source" || wrap == "both") c.source_checkpoint = "wrap";
    if (wrap == "dest" || wrap == "both") c.dest_checkpoint = "wrap";
    if (wrap == "source_after_wrap" || wrap == "both_after_wrap") c.source_checkpoint = "after_wrap";
    if (wrap == "both_after_wrap") c.dest_checkpoint = "after_wrap";
    c.through_file = p.GetBool("through_file");
    c.load_cpu = p.GetBool("load_cpu");
    const std::string group = p.GetString("process_group");
    FSDP_CHECK(group == "world" || group == "per_rank",
               "process_group must be world or per_rank, got '", group, "'");
    c.per_rank_groups = group == "per_rank";
    const std::string load_into = p.GetString("load_into");
    FSDP_CHECK(load_into == "fsdp" || load_into == "local",
               "load_into must be fsdp or local, got '", load_into, "'");
    c.load_into_local = load_into == "local";
    c.seed = static_cast<uint64_t>(p.GetInt("seed"));
    return c;
  }

  StateDictModelOptions Options(const std::string& checkpoint) const {
    return {use_orig_params, cpu_offload, mixed_precision, checkpoint, false};
  }
  // The config `_get_state_dict_mgr` builds from state_dict_rank0_and_offload.
  fsdp1::StateDictConfig Config() const;
};

// The config `_get_state_dict_mgr` builds from state_dict_rank0_and_offload.
fsdp1::StateDictConfig ConfigFor(fsdp1::StateDictType type, bool rank0_and_offload) {
  switch (type) {
    case fsdp1::StateDictType::kFullStateDict:
      return fsdp1::FullStateDictConfig{rank0_and_offload, rank0_and_offload};
    case fsdp1::StateDictType::kLocalStateDict:
      return fsdp1::LocalStateDictConfig{rank0_and_offload};
    case fsdp1::StateDictType::kShardedStateDict:
      return fsdp1::ShardedStateDictConfig{rank0_and_offload, false};
  }
  return fsdp1::FullStateDictConfig{};
}

fsdp1::StateDictConfig RoundTripCase::Config() const { return ConfigFor(type, rank0_and_offload); }

// Runner-owned inputs: the plain model's state dict, parameters drawn from generator `seed`.
CaseInputs StateDictInputs(const CaseParams& params, int world) {
  nn::ManualSeed(static_cast<uint64_t>(params.GetInt("seed")));
  nn::ModulePtr plain = BuildPlainStateDictModel(params.GetString("model"));
  CaseInputs inputs;
  inputs.weights = WeightsOf(*plain);
  inputs.ranks.resize(static_cast<size_t>(world));
  return inputs;
}

InputsDoc StateDictInputsDoc() {
  InputsDoc doc;
  doc.weights =
      "the plain (unwrapped) model's state_dict(), float32 (int64 BatchNorm counters stay "
      "int64): the seed's model named by `model`, parameters drawn from generator `seed`";
  return doc;
}

nlohmann::json ShardingJson(const nn::ShardedEntry& entry) {
  return {{"global_shape", entry.global_shape}, {"offsets", entry.offsets}};
}

ObservationSchema RoundTripSchema() {
  ObservationSchema schema;
  schema.Add(ObservationKey::StringList(
      "saved_keys", "the saved state dict's keys, in its order"));
  schema.Add(ObservationKey::Custom(
      "saved_sharding",
      {{"type", "object"},
       {"additionalProperties",
        {{"type", "object"},
         {"required", {"global_shape", "offsets"}},
         {"additionalProperties", false},
         {"properties",
          {{"global_shape", {{"type", "array"}, {"items", {{"type", "integer"}}}}},
           {"offsets", {{"type", "array"}, {"items", {{"type", "integer"}}}}}}}}}},
      "for every saved entry that is this rank's piece of a larger tensor (a ShardedTensor / "
      "DTensor): {key: {\"global_shape\": the whole tensor's shape, \"offsets\": the piece's "
      "offset in every dimension}}"));
  TensorObservation saved{"saved/{fqn}", "float32 (int64 for BatchNorm's num_batches_tracked)",
                          "the entry's shape (a piece's own shape for a sharded entry)",
                          "every value of the saved state dict, by key, copied to the CPU",
                          /*required=*/false};
  schema.AddTensors(saved);
  schema.AddTensors({"loaded/{fqn}", "float32 (int64 for num_batches_tracked)",
                     "the parameter's or buffer's full shape",
                     "after loading into the zeroed model: every parameter (tied ones under "
                     "each name) and persistent buffer, by clean FQN, read inside "
                     "summon_full_params(writeback=False)"});
  return schema;
}

// Zeroes every parameter and buffer of an FSDP model (`_zero_model(zero_buffers=True)`).
void ZeroModel(const nn::ModulePtr& fsdp_model) {
  fsdp1::SummonFullParams summon(fsdp_model);
  autograd::NoGradGuard no_grad;
  for (Tensor p : fsdp_model->parameters()) p.zero_();
  for (Tensor b : fsdp_model->buffers()) b.zero_();
}

// The seed's `_broadcast_state_dict`: rank 0's full dict on every rank (the keys and shapes
// of the plain model's dict).
nn::StateDict BroadcastStateDict(const nn::StateDict& saved, const nn::StateDict& plain,
                                 distributed::ProcessGroup& pg) {
  nn::StateDict out;
  for (const auto& [key, like] : plain) {
    const Tensor* mine = saved.find(key);
    Tensor t = pg.rank() == 0 && mine != nullptr ? mine->clone()
                                                 : Tensor::zeros(like.sizes(), like.dtype());
    pg.broadcast(t, 0);
    out.insert(key, t);
  }
  return out;
}

// torch.save / torch.load through the project's file format: safetensors bytes, with the
// sharded entries' global shapes and offsets in the metadata.
nn::StateDict ThroughFile(const nn::StateDict& sd) {
  std::vector<std::pair<std::string, Tensor>> entries(sd.begin(), sd.end());
  nlohmann::json sharding = nlohmann::json::object();
  for (const auto& [key, entry] : sd.sharded) sharding[key] = ShardingJson(entry);
  const std::string bytes =
      serialization::EncodeSafetensors(entries, {{kShardingMetadata, sharding.dump()}});
  const serialization::SafetensorsFile file = serialization::DecodeSafetensors(bytes, "<memory>");
  nn::StateDict out;
  for (const auto& [key, t] : file.Tensors()) out.insert(key, t);
  const nlohmann::json read = nlohmann::json::parse(file.metadata.at(kShardingMetadata));
  for (const auto& [key, entry] : read.items()) {
    out.sharded.insert(key, nn::ShardedEntry{entry["global_shape"].get<Shape>(),
                                             entry["offsets"].get<std::vector<int64_t>>()});
  }
  return out;
}

// The seed's `dist.new_group(ranks=[i])` for every i: this rank's own 1-rank group.
std::shared_ptr<distributed::ProcessGroup> OwnRankGroup(RankEnv& env) {
  std::shared_ptr<distributed::ProcessGroup> mine;
  for (int i = 0; i < env.world; ++i) {
    auto group = env.group().new_group({i});
    if (i == env.rank) mine = group;
  }
  return mine;
}

// `_gather_state_dict` / `_all_gather_sharded_tensor`: the whole tensor from every rank's
// dim-0 piece (zero-padded to the chunk of ceil(d0 / W) rows, all-gathered, trimmed).
Tensor GatherShardedEntry(const Tensor& piece, const nn::ShardedEntry& entry,
                          distributed::ProcessGroup& pg) {
  const Shape& global = entry.global_shape;
  int64_t numel = 1;
  for (int64_t d : global) numel *= d;
  const int64_t d0 = global.at(0);
  const int64_t row = d0 == 0 ? 0 : numel / d0;
  const int64_t chunk = (d0 + pg.size() - 1) / pg.size() * row;
  Tensor local = Tensor::zeros({chunk}, piece.dtype());
  if (piece.numel() > 0) local.narrow(0, 0, piece.numel()).copy_(piece.flatten().to(Device::CPU()));
  Tensor gathered = Tensor::empty({chunk * pg.size()}, piece.dtype());
  pg.all_gather_into_tensor(gathered, local)->wait();
  return gathered.narrow(0, 0, numel).reshape(global);
}

nn::StateDict GatherStateDict(const nn::StateDict& sd, distributed::ProcessGroup& pg) {
  nn::StateDict out;
  for (const auto& [key, value] : sd) {
    const nn::ShardedEntry* entry = sd.sharding(key);
    out.insert(key, entry == nullptr ? value : GatherShardedEntry(value, *entry, pg));
  }
  return out;
}

nlohmann::json RunRoundTripRank(RankEnv& env) {
  const RoundTripCase c = RoundTripCase::Decode(env.params);
  const nn::StateDict& weights = env.Inputs().weights();
  const std::shared_ptr<distributed::ProcessGroup> pg =
      c.per_rank_groups && env.world > 1 ? OwnRankGroup(env) : env.pg;
  nn::ModulePtr source_plain = BuildPlainStateDictModel(c.model);
  source_plain->load_state_dict(weights);
  const nn::StateDict plain_sd = source_plain->state_dict();
  auto source = WrapStateDictModel(c.model, source_plain, pg, c.Options(c.source_checkpoint));

  nn::StateDict saved;
  {
    fsdp1::StateDictTypeScope scope(source, c.type, c.Config());
    saved = source->state_dict();
  }
  nlohmann::json obs;
  obs["saved_keys"] = saved.keys();
  obs["saved_sharding"] = nlohmann::json::object();
  for (const auto& [key, entry] : saved.sharded) obs["saved_sharding"][key] = ShardingJson(entry);
  obs[kTensors] = nlohmann::json::object();
  for (const auto& [key, value] : saved) {
    obs[kTensors][kSaved + key] = TensorToJson(value.to(Device::CPU()));
  }

  if (c.rank0_and_offload && c.type == fsdp1::StateDictType::kFullStateDict && pg && pg->size() > 1) {
    saved = BroadcastStateDict(saved, plain_sd, env.group());
  }
  if (c.through_file) saved = ThroughFile(saved);
  if (c.load_cpu) {
    for (auto& [key, value] : saved) value = value.to(Device::CPU());
  }

  nn::ModulePtr dest_plain = BuildPlainStateDictModel(c.model);
  if (c.load_into_local) {
    if (pg) saved = GatherStateDict(saved, *pg);
    {
      autograd::NoGradGuard no_grad;
      for (Tensor t : dest_plain->parameters()) t.zero_();
      for (Tensor t : dest_plain->buffers()) t.zero_();
    }
    dest_plain->load_state_dict(saved, /*strict=*/true);
    for (const auto& [name, param] : dest_plain->named_parameters("", true, false)) {
      obs[kTensors][kLoaded + name] = TensorToJson(param.to(Device::CPU()));
    }
    for (const auto& [name, buffer] : dest_plain->named_buffers()) {
      if (plain_sd.contains(name)) obs[kTensors][kLoaded + name] = TensorToJson(buffer.to(Device::CPU()));
    }
    return obs;
  }
  auto dest = WrapStateDictModel(c.model, dest_plain, pg, c.Options(c.dest_checkpoint));
  ZeroModel(dest);
  {
    fsdp1::StateDictTypeScope scope(dest, c.type);
    dest->load_state_dict(saved, /*strict=*/true);
  }
  fsdp1::SummonFullParams full(dest, {.writeback = false});
  for (const auto& [name, param] : dest->named_parameters("", true, /*remove_duplicate=*/false)) {
    const std::string clean = fsdp1::CleanTensorName(name);
    if (plain_sd.contains(clean)) obs[kTensors][kLoaded + clean] = TensorToJson(param.to(Device::CPU()));
  }
  for (const auto& [name, buffer] : dest->named_buffers()) {
    const std::string clean = fsdp1::CleanTensorName(name);
    if (plain_sd.contains(clean)) obs[kTensors][kLoaded + clean] = TensorToJson(buffer.to(Device::CPU()));
  }
  return obs;
}

// ---- Expectations ------------------------------------------------------------------------------

// The flat parameter of each FSDP instance of `model` from the weights: the parameters it
// manages (under its prefix, not under a deeper instance), in the plain model's order, tied
// ones once, concatenated.
std::map<std::string, std::vector<double>> FlatParams(const std::string& model,
                                                      const nn::StateDict& weights) {
  const std::vector<std::string> instances = StateDictModelInstances(model);
  const auto owner = [&instances](const std::string& fqn) {
    std::string best;
    for (const std::string& p : instances) {
      if (!p.empty() && fqn.rfind(p + ".", 0) == 0 && p.size() > best.size()) best = p;
    }
    return best;
  };
  const bool fsdp_root = std::count(instances.begin(), instances.end(), "") > 0;
  std::map<std::string, std::vector<double>> flat;
  for (const std::string& p : instances) flat[p];
  nn::ModulePtr plain = BuildPlainStateDictModel(model);
  for (const auto& [fqn, param] : plain->named_parameters()) {  // tied parameters once
    if (!fsdp_root && owner(fqn).empty()) continue;  // not managed by FSDP
    const std::vector<double> values = weights.at(fqn).to_doubles();
    std::vector<double>& out = flat[owner(fqn)];
    out.insert(out.end(), values.begin(), values.end());
  }
  return flat;
}

std::string FlatParamKey(const std::string& instance) {
  return instance.empty() ? fsdp1::kFlatParam : instance + "." + fsdp1::kFlatParam;
}

std::vector<nlohmann::json> ExpectRoundTrip(const CaseParams& params, int world) {
  const RoundTripCase c = RoundTripCase::Decode(params);
  const CaseInputs inputs = StateDictInputs(params, world);
  nn::StateDict weights;
  for (const auto& [key, t] : inputs.weights) weights.insert(key, t);
  std::set<std::string> param_keys;
  for (const auto& [fqn, p] : BuildPlainStateDictModel(c.model)->named_parameters("", true, false)) {
    param_keys.insert(fqn);
  }
  // A group of one rank is NO_SHARD: a FULL dict with the default config, whatever the type.
  const int group_size = c.per_rank_groups ? 1 : world;
  const fsdp1::StateDictType type =
      group_size == 1 ? fsdp1::StateDictType::kFullStateDict : c.type;
  const bool rank0_only =
      group_size > 1 && type == fsdp1::StateDictType::kFullStateDict && c.rank0_and_offload;
  std::vector<nlohmann::json> expected(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    nlohmann::json& e = expected[static_cast<size_t>(r)];
    e["saved_keys"] = nlohmann::json::array();
    e["saved_sharding"] = nlohmann::json::object();
    e[kTensors] = nlohmann::json::object();
    const auto save = [&e](const std::string& key, const Tensor& t) {
      e["saved_keys"].push_back(key);
      e[kTensors][kSaved + key] = TensorToJson(t);
    };
    if (type == fsdp1::StateDictType::kLocalStateDict) {
      for (const auto& [instance, flat] : FlatParams(c.model, weights)) {
        if (flat.empty()) continue;
        const auto n = static_cast<int64_t>(flat.size());
        const int64_t chunk = (n + world - 1) / world;
        const int64_t begin = std::min(n, chunk * r);
        const int64_t end = std::min(n, chunk * (r + 1));
        const std::vector<double> piece(flat.begin() + begin, flat.begin() + end);
        save(FlatParamKey(instance), Tensor::from_doubles(piece, {end - begin}));
        e["saved_sharding"][FlatParamKey(instance)] =
            ShardingJson({{n}, {chunk * r}});
      }
    }
    for (const auto& [key, t] : weights) {
      const bool is_param = param_keys.count(key) > 0 && ManagedByFsdp(c.model, key);
      if (rank0_only && r != 0 && ManagedByFsdp(c.model, key)) continue;
      if (type == fsdp1::StateDictType::kLocalStateDict && is_param) continue;
      if (type == fsdp1::StateDictType::kShardedStateDict && is_param) {
        const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(t.sizes(), r, world);
        save(key, t.narrow(0, info.row_begin, info.rows));
        nn::ShardedEntry entry{t.sizes(), std::vector<int64_t>(t.sizes().size(), 0)};
        entry.offsets[0] = info.row_begin;
        e["saved_sharding"][key] = ShardingJson(entry);
        continue;
      }
      save(key, t);
    }
    for (const auto& [key, t] : weights) e[kTensors][kLoaded + key] = TensorToJson(t);
  }
  return expected;
}

std::vector<std::string> Sorted(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  return keys;
}

void JudgeRoundTrip(const CaseParams& params, int world, const std::vector<nlohmann::json>& per_rank,
                    CheckList& checks) {
  const std::vector<nlohmann::json> expected = ExpectRoundTrip(params, world);
  for (int r = 0; r < world; ++r) {
    const std::string who = RankName(r);
    const nlohmann::json& want = expected[static_cast<size_t>(r)];
    // A tied parameter re-registered while unsharded may come after its module's other
    // entries (PyTorch compares the keys as sets).
    checks.CheckEqual(who + " saved keys (as a set)",
                      Sorted(want["saved_keys"].get<std::vector<std::string>>()),
                      Sorted(RankObservation(per_rank, r, "saved_keys").get<std::vector<std::string>>()));
    // A rank whose piece of a sharded value is empty may hold no shard of it at all (PyTorch's
    // LOCAL ShardedTensor then has no local shard, so no offsets): the entry may be absent.
    nlohmann::json want_sharding = want["saved_sharding"];
    const nlohmann::json& got_sharding = RankObservation(per_rank, r, "saved_sharding");
    for (const auto& [key, entry] : want["saved_sharding"].items()) {
      const nlohmann::json& piece = want[kTensors][kSaved + key];
      const bool empty = piece.contains("data") && piece["data"].empty();
      if (empty && got_sharding.is_object() && !got_sharding.contains(key)) {
        want_sharding.erase(key);
      }
    }
    checks.CheckEqual(who + " saved sharding", want_sharding, got_sharding);
    CheckRankTensorsExact(checks, per_rank, r, want[kTensors]);
    // Nothing else was saved or loaded.
    std::set<std::string> want_names;
    for (const auto& [name, t] : want[kTensors].items()) want_names.insert(name);
    std::set<std::string> got_names;
    for (const auto& [name, t] : RankObservation(per_rank, r, kTensors).items()) got_names.insert(name);
    checks.CheckEqual(who + " tensors reported", want_names, got_names);
  }
  checks.SetFigure("keys", expected.front()["saved_keys"].size());
}

// ---- Parameters --------------------------------------------------------------------------------

ParamSpec TypeAxis(std::vector<std::string> values) {
  return ParamSpec::Axis("state_dict_type",
                         "state_dict (FULL), sharded_state_dict (SHARDED), local_state_dict (LOCAL)",
                         std::move(values));
}
ParamSpec BoolAxis(const std::string& name, const std::string& description) {
  return ParamSpec::Axis(name, description, {"True", "False"});
}

// Every knob of the round trip; `axes` replace the defaults by name.
std::vector<ParamSpec> RoundTripParams(const std::string& model, std::vector<ParamSpec> axes) {
  std::vector<ParamSpec> params = {
      ParamSpec::SizeString("model", "the seed's model (fsdp_state_dict_models.h)", model),
      ParamSpec::SizeString("state_dict_type", "the type saved and loaded", "state_dict"),
      ParamSpec::SizeBool("state_dict_rank0_and_offload",
                          "the config's rank0_only and offload_to_cpu (FULL) / offload_to_cpu",
                          false),
      ParamSpec::SizeBool("cpu_offload", "CPUOffload(offload_params=...)", false),
      ParamSpec::SizeBool("mixed_precision", "MixedPrecision(float16 x 3)", false),
      ParamSpec::SizeBool("use_orig_params", "FSDP's use_orig_params", false),
      ParamSpec::SizeString("checkpoint_wrap", "activation-checkpoint wrapping (none: no wrapper)",
                            "none"),
      ParamSpec::SizeBool("through_file", "the saved dict goes through the file format", false),
      ParamSpec::SizeBool("load_cpu", "the saved values are moved to the CPU before loading",
                          false),
      ParamSpec::SizeString("load_into",
                            "fsdp (the same model wrapped, zeroed) or local (the plain model, "
                            "zeroed, after the seed's _gather_state_dict)",
                            "fsdp"),
      ParamSpec::SizeString("process_group",
                            "world (the default group) or per_rank (each rank its own 1-rank "
                            "group, dist.new_group(ranks=[i]))",
                            "world"),
      ParamSpec::SizeInt("seed", "seed of the weights", 0)};
  for (ParamSpec& axis : axes) {
    for (ParamSpec& p : params) {
      if (p.name == axis.name) p = axis;
    }
  }
  return params;
}

struct RoundTripSpec {
  std::string test;
  std::string seed_test;
  std::string description;
  std::string model;
  std::vector<ParamSpec> axes;
  CaseFilter excluded;
  std::vector<TestRun> test_runs;
};

Scenario MakeRoundTrip(RoundTripSpec spec) {
  Scenario s;
  s.info.name = "fsdp_state_dict/" + spec.test;
  s.info.description = spec.description;
  s.info.seed_test = std::string(kSeed001) + spec.seed_test;
  s.info.params = RoundTripParams(spec.model, std::move(spec.axes));
  s.info.observations = RoundTripSchema();
  s.info.inputs = StateDictInputsDoc();
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.test_runs = std::move(spec.test_runs);
  s.inputs = StateDictInputs;
  s.run_rank = RunRoundTripRank;
  s.expect = ExpectRoundTrip;
  s.judge = JudgeRoundTrip;
  s.excluded = std::move(spec.excluded);
  return s;
}

const std::vector<std::string> kAllTypes = {"state_dict", "sharded_state_dict", "local_state_dict"};
const std::vector<std::string> kUnflattenedTypes = {"state_dict", "sharded_state_dict"};

// The seed's `return  # not supported`: rank0_only/offload only with FULL; use_orig_params not
// with LOCAL.
std::optional<std::string> UnsupportedBySeed(const CaseParams& p, int) {
  const std::string type = p.GetString("state_dict_type");
  if (p.GetBool("state_dict_rank0_and_offload") && type != "state_dict") {
    return "state_dict_rank0_and_offload is only supported with state_dict (the seed skips it)";
  }
  if (p.GetBool("use_orig_params") && type == "local_state_dict") {
    return "use_orig_params is not supported with local_state_dict (the seed skips it)";
  }
  return std::nullopt;
}

// ---- API-outcome scenarios ---------------------------------------------------------------------

nn::ModulePtr WrappedFromInputs(RankEnv& env, const std::string& model) {
  nn::ModulePtr plain = BuildPlainStateDictModel(model);
  plain->load_state_dict(env.Inputs().weights());
  return WrapStateDictModel(model, plain, env.pg, {});
}

Scenario ApiScenario(const std::string& test, const std::string& description,
                     const std::string& model, ObservationSchema schema, RankBody body,
                     ExpectFn expect) {
  Scenario s;
  s.info.name = "fsdp_state_dict/" + test;
  s.info.description = description;
  s.info.seed_test = std::string(kSeed001) + "test_" + test;
  s.info.params = {ParamSpec::SizeString("model", "the seed's model", model),
                   ParamSpec::SizeInt("seed", "seed of the weights", 0)};
  s.info.observations = std::move(schema);
  s.info.inputs = StateDictInputsDoc();
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.inputs = StateDictInputs;
  s.run_rank = std::move(body);
  s.expect = expect;
  s.judge = [expect](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                     CheckList& checks) {
    const std::vector<nlohmann::json> want = expect(p, world);
    for (int r = 0; r < world; ++r) {
      for (const auto& [key, value] : want[static_cast<size_t>(r)].items()) {
        CheckRankEqual(checks, per_rank, r, {key, key, value});
      }
    }
  };
  return s;
}

// test_wrong_state_dict_config: FSDP.state_dict_type(model, FULL_STATE_DICT,
// LocalStateDictConfig()) raises "Expected state_dict_config of type <FullStateDictConfig> but
// got <LocalStateDictConfig>".
Scenario WrongStateDictConfig() {
  ObservationSchema schema;
  schema.Add(ObservationKey::String("error_message", "what the call raised (\"\" if nothing)"));
  Scenario s = ApiScenario(
      "wrong_state_dict_config",
      "state_dict_type(FULL_STATE_DICT, LocalStateDictConfig()) raises, naming both config classes",
      "model", schema,
      [](RankEnv& env) {
        auto fsdp_model = WrappedFromInputs(env, env.params.GetString("model"));
        std::string message;
        try {
          fsdp1::StateDictTypeScope scope(fsdp_model, fsdp1::StateDictType::kFullStateDict,
                                          fsdp1::LocalStateDictConfig{});
        } catch (const Error& e) {
          message = e.message();
        }
        return nlohmann::json{{"error_message", message}};
      },
      [](const CaseParams&, int world) {
        return std::vector<nlohmann::json>(
            static_cast<size_t>(world),
            {{"error_message",
              "Expected state_dict_config of type FullStateDictConfig but got "
              "LocalStateDictConfig"}});
      });
  // The seed matches the message's prefix (assertRaisesRegex); the class names may be spelled
  // bare or as Python prints classes ("<class '...FullStateDictConfig'>"), expected first.
  s.judge = [](const CaseParams&, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& got = RankObservation(per_rank, r, "error_message");
      const std::string message = got.is_string() ? got.get<std::string>() : "";
      const std::string prefix = "Expected state_dict_config of type ";
      const size_t expected_at = message.find("FullStateDictConfig");
      const size_t got_at = message.find("LocalStateDictConfig");
      checks.CheckTrue(RankName(r) +
                           " error message: the seed's prefix, the expected config "
                           "(FullStateDictConfig) then the one given (LocalStateDictConfig)",
                       message.rfind(prefix, 0) == 0 && expected_at != std::string::npos &&
                           got_at != std::string::npos && expected_at < got_at,
                       "got \"" + message + "\"");
    }
  };
  return s;
}

// test_state_dict_type: inside FSDP.state_dict_type(LOCAL_STATE_DICT) every instance has it;
// after the scope every instance is back at FULL_STATE_DICT. The scope is entered after
// FSDP.set_state_dict_type(FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)), and its exit
// restores the previous config with the type (`state_dict_type`'s finally block passes
// prev_state_dict_config): the state_dict() taken after it is empty on every rank but 0.
Scenario StateDictTypeScopeScenario() {
  ObservationSchema schema;
  schema.Add(ObservationKey::StringList(
      "types_inside", "every FSDP instance's state_dict_type inside the scope (fsdp_modules order)"));
  schema.Add(ObservationKey::StringList("types_after", "the same after the scope"));
  schema.Add(ObservationKey::Boolean(
      "state_dict_empty_after",
      "whether model.state_dict() after the scope is empty (the rank0_only=True config restored)"));
  return ApiScenario(
      "state_dict_type",
      "state_dict_type(LOCAL_STATE_DICT) applies to every instance and restores FULL_STATE_DICT "
      "with its FullStateDictConfig(rank0_only=True)",
      "transformer", schema,
      [](RankEnv& env) {
        auto fsdp_model = WrappedFromInputs(env, env.params.GetString("model"));
        nlohmann::json obs{{"types_inside", nlohmann::json::array()},
                           {"types_after", nlohmann::json::array()}};
        fsdp1::FullStateDictConfig rank0_only;
        rank0_only.rank0_only = true;
        fsdp1::SetStateDictType(*fsdp_model, fsdp1::StateDictType::kFullStateDict, rank0_only);
        {
          fsdp1::StateDictTypeScope scope(fsdp_model, fsdp1::StateDictType::kLocalStateDict);
          for (const auto* m : fsdp1::FullyShardedDataParallel::fsdp_modules(fsdp_model)) {
            obs["types_inside"].push_back(fsdp1::StateDictTypeName(m->state_dict_type));
          }
        }
        for (const auto* m : fsdp1::FullyShardedDataParallel::fsdp_modules(fsdp_model)) {
          obs["types_after"].push_back(fsdp1::StateDictTypeName(m->state_dict_type));
        }
        obs["state_dict_empty_after"] = fsdp_model->state_dict().empty();
        return obs;
      },
      [](const CaseParams& p, int world) {
        const size_t n = StateDictModelInstances(p.GetString("model")).size();
        std::vector<nlohmann::json> expected;
        for (int r = 0; r < world; ++r) {
          expected.push_back({{"types_inside", std::vector<std::string>(n, "LOCAL_STATE_DICT")},
                              {"types_after", std::vector<std::string>(n, "FULL_STATE_DICT")},
                              {"state_dict_empty_after", r != 0}});
        }
        return expected;
      });
}

// test_full_state_dict_missing_unexpected_keys_cleaned: the first key removed and
// "unexpected" added; load_state_dict(strict=False) reports both without wrapper prefixes.
Scenario MissingUnexpectedKeysCleaned() {
  ObservationSchema schema;
  schema.Add(ObservationKey::StringList("missing_keys", "load_state_dict(strict=False)'s missing keys"));
  schema.Add(ObservationKey::StringList("unexpected_keys", "... and unexpected keys"));
  return ApiScenario(
      "full_state_dict_missing_unexpected_keys_cleaned",
      "strict=False reports the missing and unexpected keys without _fsdp_wrapped_module.",
      "simple_nested", schema,
      [](RankEnv& env) {
        auto fsdp_model = WrappedFromInputs(env, env.params.GetString("model"));
        nn::StateDict sd = fsdp_model->state_dict();
        sd.erase(sd.keys().front());
        sd.insert("unexpected", Tensor::ones({1}));
        const nn::IncompatibleKeys keys = fsdp_model->load_state_dict(sd, /*strict=*/false);
        return nlohmann::json{{"missing_keys", keys.missing_keys},
                              {"unexpected_keys", keys.unexpected_keys}};
      },
      [](const CaseParams& p, int world) {
        const std::string first =
            BuildPlainStateDictModel(p.GetString("model"))->state_dict().keys().front();
        return std::vector<nlohmann::json>(
            static_cast<size_t>(world),
            {{"missing_keys", {first}}, {"unexpected_keys", {"unexpected"}}});
      });
}


// The persistent state (parameters, tied ones under each name, and persistent buffers) of an
// FSDP model by clean FQN, read inside summon_full_params(writeback=False), into
// obs[tensors][prefix + fqn]; only names of `plain_keys`.
void ReportFullState(const nn::ModulePtr& fsdp_model, const nn::StateDict& plain_keys,
                     const std::string& prefix, nlohmann::json& obs) {
  fsdp1::SummonFullParams full(fsdp_model, {.writeback = false});
  for (const auto& [name, param] : fsdp_model->named_parameters("", true, false)) {
    const std::string clean = fsdp1::CleanTensorName(name);
    if (plain_keys.contains(clean)) obs[kTensors][prefix + clean] = TensorToJson(param.to(Device::CPU()));
  }
  for (const auto& [name, buffer] : fsdp_model->named_buffers()) {
    const std::string clean = fsdp1::CleanTensorName(name);
    if (plain_keys.contains(clean)) obs[kTensors][prefix + clean] = TensorToJson(buffer.to(Device::CPU()));
  }
}

nlohmann::json WeightsJson(const CaseParams& params, int world, const std::string& prefix) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, t] : StateDictInputs(params, world).weights) out[prefix + key] = TensorToJson(t);
  return out;
}

Scenario CustomScenario(const std::string& test, const std::string& seed_test,
                        const std::string& description, std::vector<ParamSpec> params,
                        ObservationSchema schema, RankBody body, ExpectFn expect,
                        int default_world, int min_world) {
  Scenario s;
  s.info.name = "fsdp_state_dict/" + test;
  s.info.description = description;
  s.info.seed_test = seed_test;
  s.info.params = std::move(params);
  s.info.observations = std::move(schema);
  s.info.inputs = StateDictInputsDoc();
  s.info.default_world = default_world;
  s.info.min_world = min_world;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.inputs = StateDictInputs;
  s.run_rank = std::move(body);
  s.expect = expect;
  s.judge = [expect](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                     CheckList& checks) {
    const std::vector<nlohmann::json> want = expect(p, world);
    for (int r = 0; r < world; ++r) {
      for (const auto& [key, value] : want[static_cast<size_t>(r)].items()) {
        if (key == kTensors) continue;
        if (key == "saved_keys") {  // as a set (see JudgeRoundTrip)
          checks.CheckEqual(RankName(r) + " saved keys (as a set)",
                            Sorted(value.get<std::vector<std::string>>()),
                            Sorted(RankObservation(per_rank, r, key).get<std::vector<std::string>>()));
          continue;
        }
        CheckRankEqual(checks, per_rank, r, {key, key, value});
      }
      const nlohmann::json& tensors = want[static_cast<size_t>(r)][kTensors];
      CheckRankTensorsExact(checks, per_rank, r, tensors);
      std::set<std::string> want_names;
      for (const auto& [name, t] : tensors.items()) want_names.insert(name);
      std::set<std::string> got_names;
      for (const auto& [name, t] : RankObservation(per_rank, r, kTensors).items()) {
        got_names.insert(name);
      }
      checks.CheckEqual(RankName(r) + " tensors reported", want_names, got_names);
    }
  };
  return s;
}

// test_state_dict_rank0_offload_save_load_flow: a FULL rank0_only + offload_to_cpu dict is
// loaded on rank 0 only into a zeroed plain model, which FSDP then wraps with
// sync_module_states=True: every rank holds the weights.
Scenario Rank0OffloadSaveLoadFlow() {
  ObservationSchema schema;
  schema.Add(ObservationKey::StringList("saved_keys", "the rank0_only dict's keys on this rank"));
  schema.AddTensors({"synced/{fqn}", "float32 (int64 for integer buffers)",
                     "the parameter's or buffer's full shape",
                     "the new FSDP model's parameters and persistent buffers after "
                     "sync_module_states, read inside summon_full_params"});
  return CustomScenario(
      "state_dict_rank0_offload_save_load_flow",
      std::string(kSeed001) + "test_state_dict_rank0_offload_save_load_flow",
      "FULL rank0_only + offload_to_cpu save, load on rank 0 into a plain model, "
      "sync_module_states=True: every rank holds the weights",
      {ParamSpec::SizeString("model", "the seed's model", "transformer"),
       ParamSpec::Axis("use_orig_params", "FSDP's use_orig_params", {"False", "True"}),
       ParamSpec::SizeInt("seed", "seed of the weights", 0)},
      schema,
      [](RankEnv& env) {
        const std::string model = env.params.GetString("model");
        nn::ModulePtr plain = BuildPlainStateDictModel(model);
        plain->load_state_dict(env.Inputs().weights());
        const nn::StateDict plain_sd = plain->state_dict();
        StateDictModelOptions options;
        options.use_orig_params = env.params.GetBool("use_orig_params");
        auto source = WrapStateDictModel(model, plain, env.pg, options);
        nn::StateDict saved;
        {
          fsdp1::StateDictTypeScope scope(source, fsdp1::StateDictType::kFullStateDict,
                                          fsdp1::FullStateDictConfig{true, true});
          for (const auto& [key, value] : source->state_dict()) saved.insert(key, value.clone());
        }
        nlohmann::json obs{{"saved_keys", saved.keys()}, {kTensors, nlohmann::json::object()}};
        nn::ModulePtr fresh = BuildPlainStateDictModel(model);
        {
          autograd::NoGradGuard no_grad;
          for (Tensor t : fresh->parameters()) t.zero_();
          for (Tensor t : fresh->buffers()) t.zero_();
        }
        if (env.rank == 0) fresh->load_state_dict(saved, /*strict=*/true);
        StateDictModelOptions sync;
        sync.sync_module_states = true;
        auto synced = WrapStateDictModel(model, fresh, env.pg, sync);
        ReportFullState(synced, plain_sd, "synced/", obs);
        return obs;
      },
      [](const CaseParams& p, int world) {
        const nn::StateDict plain = BuildPlainStateDictModel(p.GetString("model"))->state_dict();
        std::vector<nlohmann::json> out(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) {
          out[static_cast<size_t>(r)] = {
              {"saved_keys", r == 0 || world == 1 ? plain.keys() : std::vector<std::string>{}},
              {kTensors, WeightsJson(p, world, "synced/")}};
        }
        return out;
      },
      2, 1);
}

// TestFSDPStateDict4GPUs.test_local_state_dict_reshard: a LOCAL dict saved on `world` ranks is
// all-gathered, re-chunked into 2 pieces (torch.chunk(2)) at offsets 0 and len(chunk 0) and
// loaded on ranks 0 and 1 into the same model wrapped over new_group([0, 1]); its FULL dict
// then holds the weights, as the first model's does.
Scenario LocalStateDictReshard() {
  ObservationSchema schema;
  schema.AddTensors({"full/{fqn}", "float32", "the entry's full shape",
                     "the first model's FULL state dict (every rank)"});
  TensorObservation resharded{"resharded/{fqn}", "float32", "the entry's full shape",
                              "ranks 0 and 1: the 2-rank model's FULL state dict after loading "
                              "the resharded LOCAL dict",
                              /*required=*/false};
  schema.AddTensors(resharded);
  return CustomScenario(
      "local_state_dict_reshard",
      "test_fsdp_state_dict.py::TestFSDPStateDict4GPUs::test_local_state_dict_reshard",
      "LOCAL dict of `world` ranks resharded to 2 ranks (new_group([0, 1])) and loaded: both "
      "FULL dicts hold the weights",
      {ParamSpec::SizeString("model", "the seed's model", "model"),
       ParamSpec::SizeInt("seed", "seed of the weights", 0)},
      schema,
      [](RankEnv& env) {
        const std::string model = env.params.GetString("model");
        nn::ModulePtr plain = BuildPlainStateDictModel(model);
        plain->load_state_dict(env.Inputs().weights());
        auto fsdp_model = WrapStateDictModel(model, plain, env.pg, {});
        nn::StateDict local;
        {
          fsdp1::StateDictTypeScope scope(fsdp_model, fsdp1::StateDictType::kLocalStateDict);
          local = fsdp_model->state_dict();
        }
        auto new_pg = env.group().new_group({0, 1});
        nn::StateDict resharded;
        for (const auto& [key, value] : local) {
          const nn::ShardedEntry* entry = local.sharding(key);
          if (entry == nullptr) {
            if (env.rank < 2) resharded.insert(key, value);
            continue;
          }
          const Tensor full_flat = GatherShardedEntry(value, *entry, env.group());
          if (env.rank >= 2) continue;
          const int64_t n = full_flat.numel();
          const int64_t chunk0 = (n + 1) / 2;  // torch.chunk(2)
          const int64_t begin = env.rank == 0 ? 0 : chunk0;
          const int64_t end = env.rank == 0 ? chunk0 : n;
          resharded.insert(key, full_flat.narrow(0, begin, end - begin).clone());
          resharded.sharded.insert(key, nn::ShardedEntry{{n}, {begin}});
        }
        nlohmann::json obs{{kTensors, nlohmann::json::object()}};
        nn::ModulePtr model2;
        if (env.rank < 2) {
          model2 = WrapStateDictModel(model, BuildPlainStateDictModel(model), new_pg, {});
          fsdp1::StateDictTypeScope scope(model2, fsdp1::StateDictType::kLocalStateDict);
          model2->load_state_dict(resharded);
        }
        for (const auto& [key, value] : fsdp_model->state_dict()) {
          obs[kTensors]["full/" + key] = TensorToJson(value.to(Device::CPU()));
        }
        if (model2) {
          for (const auto& [key, value] : model2->state_dict()) {
            obs[kTensors]["resharded/" + key] = TensorToJson(value.to(Device::CPU()));
          }
        }
        return obs;
      },
      [](const CaseParams& p, int world) {
        std::vector<nlohmann::json> out(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) {
          nlohmann::json tensors = WeightsJson(p, world, "full/");
          if (r < 2) tensors.update(WeightsJson(p, world, "resharded/"));
          out[static_cast<size_t>(r)] = {{kTensors, tensors}};
        }
        return out;
      },
      4, 2);
}

// test_state_dict_save_load_flow: the seed's Model trained 3 SGD steps (lr 0.1, loss
// out.sum(), each rank on its own runner-owned batch) under FSDP, saved, loaded into a zeroed
// FSDP copy, against the same training under DistributedDataParallel, whose replicas on ranks
// other than 0 start from zeros (its construction must broadcast rank 0's parameters and
// buffers, reported right after it) and get their buffers zeroed after its construction
// (broadcast_buffers: every forward must broadcast rank 0's again).
constexpr int64_t kFlowSteps = 3;

CaseInputs FlowInputs(const CaseParams& params, int world) {
  CaseInputs inputs = StateDictInputs(params, world);
  for (int r = 0; r < world; ++r) {
    Generator gen(static_cast<uint64_t>(params.GetInt("seed")) * 1000003 + 101 + static_cast<uint64_t>(r));
    inputs.ranks[static_cast<size_t>(r)].emplace_back("in_data", Tensor::rand({64, 4}, DType::kFloat32, &gen));
  }
  return inputs;
}

void TrainFlow(const nn::ModulePtr& model, const Tensor& in_data, int64_t steps = kFlowSteps) {
  optim::SGD optimizer(model->parameters(), optim::SGDOptions{.lr = 0.1});
  for (int64_t k = 0; k < steps; ++k) {
    fsdp::sum((*model)(nn::Value(in_data)).tensor()).backward();
    optimizer.step();
    optimizer.zero_grad();
  }
}

Scenario StateDictSaveLoadFlow() {
  Scenario s;
  s.info.name = "fsdp_state_dict/state_dict_save_load_flow";
  s.info.description =
      "the seed's Model trained 3 SGD steps under FSDP, saved and loaded into a zeroed FSDP "
      "copy (values moved to the CPU or not), vs the same training under "
      "DistributedDataParallel; then one more step of the saver and of the loaded copy must "
      "give identical parameters (training continues as without the save)";
  s.info.seed_test = std::string(kSeed001) + "test_state_dict_save_load_flow";
  s.info.params = {TypeAxis(kAllTypes),
                   BoolAxis("move_to_cpu", "the saved values are moved to the CPU before loading"),
                   ParamSpec::SizeString("model", "the seed's model", "model"),
                   ParamSpec::SizeInt("seed", "seed of the weights and batches", 0),
                   ParamSpec::SizeDouble("atol", "absolute tolerance (float32)", 1e-5),
                   ParamSpec::SizeDouble("rtol", "relative tolerance (float32)", 1e-4)};
  s.info.observations.AddTensors({"fsdp/{fqn}", "float32", "the parameter's full shape",
                                  "the loaded FSDP copy's parameters (summon_full_params), by "
                                  "clean FQN"});
  s.info.observations.AddTensors({"ddp/{fqn}", "float32", "the parameter's full shape",
                                  "the DistributedDataParallel replica's parameters after the "
                                  "same training, by the plain model's FQN"});
  s.info.observations.AddTensors({"ddp_buffers/{fqn}", "float32", "the buffer's shape",
                                  "the DistributedDataParallel replica's buffers (persistent or "
                                  "not) after the training, by the plain model's FQN"});
  s.info.observations.AddTensors({"ddp_constructed_buffers/{fqn}", "float32", "the buffer's shape",
                                  "the DistributedDataParallel replica's buffers right after its "
                                  "construction (before any forward), by the plain model's FQN"});
  s.info.observations.AddTensors({"continued/saver/{fqn}", "float32", "the parameter's full shape",
                                  "the saving FSDP model's parameters after one more SGD step "
                                  "(summon_full_params), by clean FQN"});
  s.info.observations.AddTensors({"continued/loaded/{fqn}", "float32",
                                  "the parameter's full shape",
                                  "the loaded copy's parameters after the same step"});
  s.info.inputs = StateDictInputsDoc();
  s.info.inputs.rank_tensors = {{"in_data", "float32", "[64, 4]",
                                 "the rank's batch, used at every step (uniform [0, 1))"}};
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.test_runs = {{3, {{"move_to_cpu", "False"}}}};
  s.inputs = FlowInputs;
  s.run_rank = [](RankEnv& env) {
    const std::string model = env.params.GetString("model");
    const fsdp1::StateDictType type = ParseStateDictType(env.params.GetString("state_dict_type"));
    const Tensor in_data = env.Inputs().Get("in_data").to(env.device);
    nn::ModulePtr plain = BuildPlainStateDictModel(model);
    plain->load_state_dict(env.Inputs().weights());
    const nn::StateDict plain_sd = plain->state_dict();
    auto fsdp_model = WrapStateDictModel(model, plain, env.pg, {});
    TrainFlow(fsdp_model, in_data);
    nn::StateDict saved;
    {
      fsdp1::StateDictTypeScope scope(fsdp_model, type);
      saved = fsdp_model->state_dict();
    }
    if (env.params.GetBool("move_to_cpu")) {
      for (auto& [key, value] : saved) value = value.to(Device::CPU());
    }
    auto blank = WrapStateDictModel(model, BuildPlainStateDictModel(model), env.pg, {});
    ZeroModel(blank);
    {
      fsdp1::StateDictTypeScope scope(blank, type);
      blank->load_state_dict(saved);
    }
    nlohmann::json obs{{kTensors, nlohmann::json::object()}};
    {
      fsdp1::SummonFullParams full(blank, {.writeback = false});
      for (const auto& [name, p] : blank->named_parameters()) {
        obs[kTensors]["fsdp/" + fsdp1::CleanTensorName(name)] = TensorToJson(p.to(Device::CPU()));
      }
    }
    // Training continues as without the save: one more step of both models.
    for (const auto& [prefix, m] : {std::pair{"continued/saver/", fsdp_model},
                                    std::pair{"continued/loaded/", blank}}) {
      TrainFlow(m, in_data, /*steps=*/1);
      fsdp1::SummonFullParams full(m, {.writeback = false});
      for (const auto& [name, p] : m->named_parameters()) {
        obs[kTensors][prefix + fsdp1::CleanTensorName(name)] = TensorToJson(p.to(Device::CPU()));
      }
    }
    nn::ModulePtr replica = BuildPlainStateDictModel(model);
    replica->load_state_dict(env.Inputs().weights());
    if (env.rank != 0) {
      // DistributedDataParallel's construction broadcasts rank 0's parameters and buffers
      // (`_sync_module_states`): the other ranks' replicas start from zeros.
      autograd::NoGradGuard no_grad;
      for (Tensor p : replica->parameters()) p.zero_();
      for (Tensor b : replica->buffers()) b.zero_();
    }
    auto ddp_model = std::make_shared<ddp::DistributedDataParallel>(
        replica, ddp::DistributedDataParallelOptions{.process_group = env.pg});
    for (const auto& [name, b] : replica->named_buffers()) {
      obs[kTensors]["ddp_constructed_buffers/" + name] = TensorToJson(b.to(Device::CPU()));
    }
    if (env.rank != 0) {
      // broadcast_buffers=True: each forward broadcasts rank 0's buffers again.
      autograd::NoGradGuard no_grad;
      for (Tensor b : replica->buffers()) b.zero_();
    }
    TrainFlow(ddp_model, in_data);
    for (const auto& [name, p] : replica->named_parameters()) {
      obs[kTensors]["ddp/" + name] = TensorToJson(p.to(Device::CPU()));
    }
    for (const auto& [name, b] : replica->named_buffers()) {
      obs[kTensors]["ddp_buffers/" + name] = TensorToJson(b.to(Device::CPU()));
    }
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const Tolerance tol{p.GetDouble("atol"), p.GetDouble("rtol")};
    std::set<std::string> names;
    std::set<std::string> buffer_names;
    {
      const nn::ModulePtr plain = BuildPlainStateDictModel(p.GetString("model"));
      for (const auto& [fqn, t] : plain->named_parameters()) names.insert(fqn);
      for (const auto& [fqn, t] : plain->named_buffers()) buffer_names.insert(fqn);
    }
    ErrorStats err;
    for (int r = 0; r < world; ++r) {
      const reference::RefTensorMap fsdp_params = MapFromObservations(per_rank, r, "fsdp/");
      const reference::RefTensorMap ddp_params = MapFromObservations(per_rank, r, "ddp/");
      std::set<std::string> got;
      for (const auto& [name, t] : fsdp_params) got.insert(name);
      checks.CheckEqual(RankName(r) + " loaded parameter names", names, got);
      err.Merge(CheckMapsClose(checks, RankName(r) + " loaded FSDP parameters vs DDP", ddp_params,
                               fsdp_params, tol));
      // Same values, same step: the loaded copy continues bit for bit as the saver does.
      CheckMapsClose(checks, RankName(r) + " one more step: loaded copy vs saver",
                     MapFromObservations(per_rank, r, "continued/saver/"),
                     MapFromObservations(per_rank, r, "continued/loaded/"), Tolerance{0, 0});
      // Training moved every parameter away from the weights.
      const CaseInputs inputs = FlowInputs(p, world);
      for (const auto& [key, w] : inputs.weights) {
        const auto it = ddp_params.find(key);
        if (it == ddp_params.end()) continue;
        const std::vector<double> before = w.to_doubles();
        checks.CheckTrue(RankName(r) + " " + key + " changed by training",
                         before != it->second.data);
      }
      // The ranks' batches differ: equal replicas show the gradients were averaged.
      if (r > 0) {
        err.Merge(CheckMapsClose(checks, RankName(r) + " DDP replica vs rank 0's",
                                 MapFromObservations(per_rank, 0, "ddp/"), ddp_params, tol));
      }
      // broadcast_buffers: rank 0's buffers on every rank, bit for bit.
      const reference::RefTensorMap ddp_buffers = MapFromObservations(per_rank, r, "ddp_buffers/");
      std::set<std::string> got_buffers;
      for (const auto& [name, t] : ddp_buffers) got_buffers.insert(name);
      checks.CheckEqual(RankName(r) + " DDP replica buffer names", buffer_names, got_buffers);
      if (r > 0) {
        CheckMapsClose(checks, RankName(r) + " DDP replica buffers vs rank 0's (broadcast_buffers)",
                       MapFromObservations(per_rank, 0, "ddp_buffers/"), ddp_buffers,
                       Tolerance{0, 0});
        // _sync_module_states (broadcast_buffers=True) broadcasts the buffers at construction,
        // before any forward re-broadcasts them.
        CheckMapsClose(checks, RankName(r) + " DDP replica buffers after construction vs rank 0's",
                       MapFromObservations(per_rank, 0, "ddp_constructed_buffers/"),
                       MapFromObservations(per_rank, r, "ddp_constructed_buffers/"),
                       Tolerance{0, 0});
      }
    }
    checks.SetFigure("param_max_abs_err", err.max_abs);
    checks.SetFigure("param_max_rel_err", err.max_rel);
  };
  return s;
}


// test_save_and_load_after_forward_state_dict: the simple nested model (float16 mixed
// precision or not) trained 6 SGD steps (lr 0.1) on the rank's runner-owned [10] inputs; its
// state dict saved (values float32 whatever the mixed precision), the model zeroed, the dict
// loaded back: the parameters are the trained ones again.
constexpr int64_t kAfterForwardSteps = 6;

CaseInputs AfterForwardInputs(const CaseParams& params, int world) {
  CaseInputs inputs = StateDictInputs(params, world);
  for (int r = 0; r < world; ++r) {
    Generator gen(static_cast<uint64_t>(params.GetInt("seed")) * 1000003 + 211 + static_cast<uint64_t>(r));
    for (int64_t k = 0; k < kAfterForwardSteps; ++k) {
      inputs.ranks[static_cast<size_t>(r)].emplace_back(StepInputName(k),
                                                        Tensor::randn({10}, DType::kFloat32, &gen));
    }
  }
  return inputs;
}

Scenario SaveAndLoadAfterForward() {
  Scenario s;
  s.info.name = "fsdp_state_dict/save_and_load_after_forward_state_dict";
  s.info.description =
      "the nested model trained 6 SGD steps (float16 mixed precision or not), saved (float32 "
      "values), zeroed and loaded back: the trained parameters return";
  s.info.seed_test = std::string(kSeed001) + "test_save_and_load_after_forward_state_dict";
  s.info.params = {TypeAxis(kAllTypes),
                   BoolAxis("mixed_precision", "MixedPrecision(float16 x 3)"),
                   BoolAxis("state_dict_rank0_and_offload", "rank0_only and offload_to_cpu"),
                   ParamSpec::SizeString("model", "the seed's model", "simple_nested"),
                   ParamSpec::SizeInt("seed", "seed of the weights and inputs", 0)};
  s.info.observations.Add(ObservationKey::StringList(
      "loss_dtypes", "every training step's loss dtype (float16 under mixed precision)"));
  s.info.observations.Add(ObservationKey::Custom(
      "saved_dtypes", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}},
      "the saved state dict's value dtypes by key"));
  s.info.observations.AddTensors({"trained/{fqn}", "float32", "the parameter's full shape",
                                  "the parameters after training (summon_full_params)"});
  s.info.observations.AddTensors({"loaded/{fqn}", "float32", "the parameter's full shape",
                                  "the parameters after zeroing and loading the saved dict"});
  s.info.inputs = StateDictInputsDoc();
  s.info.inputs.rank_tensors = {{"step{k}/input", "float32", "[10]", "the rank's input of step k"}};
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.excluded = [](const CaseParams& p, int) -> std::optional<std::string> {
    if (p.GetBool("state_dict_rank0_and_offload") && p.GetString("state_dict_type") != "state_dict") {
      return "state_dict_rank0_and_offload is only supported with state_dict (the seed skips it)";
    }
    return std::nullopt;
  };
  s.inputs = AfterForwardInputs;
  s.run_rank = [](RankEnv& env) {
    const std::string model = env.params.GetString("model");
    const fsdp1::StateDictType type = ParseStateDictType(env.params.GetString("state_dict_type"));
    const bool rank0 = env.params.GetBool("state_dict_rank0_and_offload");
    nn::ModulePtr plain = BuildPlainStateDictModel(model);
    plain->load_state_dict(env.Inputs().weights());
    const nn::StateDict plain_sd = plain->state_dict();
    StateDictModelOptions options;
    options.mixed_precision = env.params.GetBool("mixed_precision");
    nn::ModulePtr fsdp_model = WrapStateDictModel(model, plain, env.pg, options);
    optim::SGD optimizer(fsdp_model->parameters(), optim::SGDOptions{.lr = 0.1});
    nlohmann::json obs{{"loss_dtypes", nlohmann::json::array()},
                       {"saved_dtypes", nlohmann::json::object()},
                       {kTensors, nlohmann::json::object()}};
    for (int64_t k = 0; k < kAfterForwardSteps; ++k) {
      const Tensor in = env.Inputs().Get(StepInputName(k)).to(env.device);
      Tensor loss = fsdp::sum((*fsdp_model)(nn::Value(in)).tensor());
      obs["loss_dtypes"].push_back(DTypeName(loss.dtype()));
      loss.backward();
      optimizer.step();
    }
    ReportFullState(fsdp_model, plain_sd, "trained/", obs);
    nn::StateDict saved;
    {
      fsdp1::StateDictTypeScope scope(fsdp_model, type, ConfigFor(type, rank0));
      const nn::StateDict sd = fsdp_model->state_dict();
      saved = sd;
      for (auto& [key, value] : saved) value = value.clone();
    }
    for (const auto& [key, value] : saved) obs["saved_dtypes"][key] = DTypeName(value.dtype());
    ZeroModel(fsdp_model);
    if (rank0 && type == fsdp1::StateDictType::kFullStateDict && env.world > 1) {
      saved = BroadcastStateDict(saved, plain_sd, env.group());
    }
    {
      fsdp1::StateDictTypeScope scope(fsdp_model, type);
      fsdp_model->load_state_dict(saved, /*strict=*/true);
    }
    ReportFullState(fsdp_model, plain_sd, "loaded/", obs);
    return obs;
  };
  s.judge = [](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
               CheckList& checks) {
    const std::string loss_dtype = p.GetBool("mixed_precision") ? "float16" : "float32";
    const CaseInputs inputs = AfterForwardInputs(p, world);
    for (int r = 0; r < world; ++r) {
      const std::string who = RankName(r);
      checks.CheckEqual(who + " loss dtypes",
                        std::vector<std::string>(kAfterForwardSteps, loss_dtype),
                        RankObservation(per_rank, r, "loss_dtypes"));
      for (const auto& [key, dtype] : RankObservation(per_rank, r, "saved_dtypes").items()) {
        checks.CheckEqual(who + " saved " + key + " dtype", "float32", dtype);
      }
      const reference::RefTensorMap trained = MapFromObservations(per_rank, r, "trained/");
      const reference::RefTensorMap loaded = MapFromObservations(per_rank, r, "loaded/");
      CheckMapsClose(checks, who + " loaded parameters vs trained", trained, loaded,
                     Tolerance{0, 0});
      for (const auto& [key, w] : inputs.weights) {
        const auto it = trained.find(key);
        checks.CheckTrue(who + " " + key + " trained",
                         it != trained.end() && it->second.data != w.to_doubles());
      }
    }
  };
  return s;
}

// test_state_dict_with_ignored_modules: the seed's Model, inner = FSDP(inner) (itself ignored
// with ignore_inner, float16 mixed precision or not; with wrap_inner=False inner is left to the
// root, which then has parameters of its own beside the ignored module's buffer), the root
// FSDP(model, ignored_modules=[outer]). The state dict (under an optional "foo." prefix) holds the
// ignored parameters and every buffer without copying them (same data as the live tensors,
// again on a second call), buffers in float32 (ignored ones never cast), and loads into the
// plain model (prefix stripped) as the weights.
Scenario StateDictWithIgnoredModules() {
  Scenario s;
  s.info.name = "fsdp_state_dict/state_dict_with_ignored_modules";
  s.info.description =
      "ignored modules' parameters and the buffers are saved uncopied (float32), under an "
      "optional prefix, and load into the plain model";
  s.info.seed_test = std::string(kSeed001) + "test_state_dict_with_ignored_modules";
  s.info.params = {TypeAxis(kUnflattenedTypes),
                   BoolAxis("prefix", "state_dict(prefix=\"foo.\") or no prefix"),
                   BoolAxis("ignore_inner", "inner's FSDP ignores inner itself"),
                   BoolAxis("mixed_precision", "MixedPrecision(float16 x 3)"),
                   ParamSpec::SizeBool("wrap_inner",
                                       "the seed's wrap_fsdp: inner gets its own FSDP instance "
                                       "(False: the root manages inner; ignore_inner is moot)",
                                       true),
                   ParamSpec::SizeString("model", "the seed's model", "model"),
                   ParamSpec::SizeInt("seed", "seed of the weights", 0)};
  s.info.observations.Add(ObservationKey::StringList("saved_keys", "the state dict's keys"));
  s.info.observations.Add(ObservationKey::Custom(
      "uncopied", {{"type", "object"}, {"additionalProperties", {{"type", "boolean"}}}},
      "for each ignored parameter and each buffer (by FQN): whether the saved value shares the "
      "live tensor's data, in the first and (\"<fqn>@again\") a second state_dict() call; "
      "buffers under float16 buffer mixed precision of a non-ignored module are left out (saved "
      "as a float32 copy)"));
  s.info.observations.Add(ObservationKey::Custom(
      "buffer_dtypes", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}},
      "the saved buffers' dtypes by FQN"));
  s.info.observations.AddTensors({"loaded/{fqn}", "float32", "the entry's shape",
                                  "the plain model after loading the saved dict (prefix "
                                  "stripped, sharded entries gathered)"});
  s.info.inputs = StateDictInputsDoc();
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  s.info.requirements.devices = {DeviceType::kCPU};
  s.info.test_runs = {{3, {{"mixed_precision", "True"}}}};
  // The root with parameters of its own (inner's) and an ignored buffer (outer's): under buffer
  // mixed precision its post-state-dict hook casts and copies its buffers but the ignored ones.
  s.info.extra_default_runs = {{2, {{"wrap_inner", "False"}, {"ignore_inner", "False"}}}};
  s.inputs = StateDictInputs;
  s.run_rank = [](RankEnv& env) {
    const fsdp1::StateDictType type = ParseStateDictType(env.params.GetString("state_dict_type"));
    const std::string prefix = env.params.GetBool("prefix") ? "foo." : "";
    const bool wrap_inner = env.params.GetBool("wrap_inner");
    const bool ignore_inner = wrap_inner && env.params.GetBool("ignore_inner");
    const bool mixed_precision = env.params.GetBool("mixed_precision");
    nn::ModulePtr plain = BuildPlainStateDictModel("model");
    plain->load_state_dict(env.Inputs().weights());
    fsdp1::FullyShardedDataParallelOptions options;
    options.process_group = env.pg;
    if (mixed_precision) {
      options.mixed_precision.param_dtype = DType::kFloat16;
      options.mixed_precision.reduce_dtype = DType::kFloat16;
      options.mixed_precision.buffer_dtype = DType::kFloat16;
    }
    nn::ModulePtr inner = plain->child("inner");
    nn::ModulePtr outer = plain->child("outer");
    fsdp1::FullyShardedDataParallelOptions inner_options = options;
    if (ignore_inner) inner_options.ignored_modules = {inner};
    if (wrap_inner) {
      plain->register_module(
          "inner", std::make_shared<fsdp1::FullyShardedDataParallel>(inner, inner_options));
    }
    fsdp1::FullyShardedDataParallelOptions root_options = options;
    root_options.ignored_modules = {outer};
    auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(plain, root_options);
    // The live tensors whose saved values must not be copies.
    std::vector<std::pair<std::string, Tensor>> live = {{"outer.weight", outer->parameter("weight")},
                                                        {"outer.bias", outer->parameter("bias")}};
    if (ignore_inner) {
      live.emplace_back("inner.weight", inner->parameter("weight"));
      live.emplace_back("inner.bias", inner->parameter("bias"));
    }
    fsdp_model->check_is_root();  // lazy init casts the buffers
    if (!mixed_precision || ignore_inner) live.emplace_back("inner.buffer", inner->buffer("buffer"));
    live.emplace_back("outer.buffer", outer->buffer("buffer"));
    const auto save = [&] {
      fsdp1::StateDictTypeScope scope(fsdp_model, type);
      return fsdp_model->state_dict(prefix);
    };
    const nn::StateDict sd1 = save();
    nlohmann::json obs{{"saved_keys", sd1.keys()},
                       {"uncopied", nlohmann::json::object()},
                       {"buffer_dtypes", nlohmann::json::object()},
                       {kTensors, nlohmann::json::object()}};
    for (const char* b : {"inner.buffer", "outer.buffer"}) {
      if (const Tensor* t = sd1.find(prefix + b)) obs["buffer_dtypes"][b] = DTypeName(t->dtype());
    }
    const nn::StateDict sd2 = save();
    for (const auto& [name, tensor] : live) {
      const Tensor* first = sd1.find(prefix + name);
      const Tensor* again = sd2.find(prefix + name);
      obs["uncopied"][name] = first != nullptr && first->data_ptr() == tensor.data_ptr();
      obs["uncopied"][name + "@again"] = again != nullptr && again->data_ptr() == tensor.data_ptr();
    }
    nn::StateDict to_load = env.pg ? GatherStateDict(sd1, *env.pg) : sd1;
    if (!prefix.empty()) nn::ReplaceByPrefix(to_load, prefix, "");
    nn::ModulePtr nonwrapped = BuildPlainStateDictModel("model");
    {
      autograd::NoGradGuard no_grad;
      for (Tensor t : nonwrapped->parameters()) t.zero_();
    }
    nonwrapped->load_state_dict(to_load, /*strict=*/true);
    for (const auto& [key, value] : nonwrapped->state_dict()) {
      obs[kTensors][kLoaded + key] = TensorToJson(value);
    }
    return obs;
  };
  s.expect = [](const CaseParams& p, int world) {
    const std::string prefix = p.GetBool("prefix") ? "foo." : "";
    // inner's parameters and buffer are ignored only by its own instance's ignored_modules.
    const bool ignore_inner = p.GetBool("wrap_inner") && p.GetBool("ignore_inner");
    const bool mixed_precision = p.GetBool("mixed_precision");
    const nn::StateDict plain = BuildPlainStateDictModel("model")->state_dict();
    nlohmann::json e{{"saved_keys", nlohmann::json::array()},
                     {"uncopied", nlohmann::json::object()},
                     {"buffer_dtypes", {{"inner.buffer", "float32"}, {"outer.buffer", "float32"}}},
                     {kTensors, WeightsJson(p, world, kLoaded)}};
    for (const std::string& key : plain.keys()) e["saved_keys"].push_back(prefix + key);
    if (mixed_precision && !ignore_inner) {
      // inner's buffer lives in float16 after lazy init: the saved float32 value is its
      // rounding.
      for (const auto& [key, t] : StateDictInputs(p, world).weights) {
        if (key == "inner.buffer") {
          e[kTensors][kLoaded + key] = TensorToJson(t.to(DType::kFloat16).to(DType::kFloat32));
        }
      }
    }
    std::vector<std::string> uncopied = {"outer.weight", "outer.bias"};
    if (ignore_inner) {
      uncopied.push_back("inner.weight");
      uncopied.push_back("inner.bias");
    }
    if (!mixed_precision || ignore_inner) uncopied.push_back("inner.buffer");
    uncopied.push_back("outer.buffer");
    for (const std::string& name : uncopied) {
      e["uncopied"][name] = true;
      e["uncopied"][name + "@again"] = true;
    }
    return std::vector<nlohmann::json>(static_cast<size_t>(world), e);
  };
  s.judge = [expect = s.expect](const CaseParams& p, int world,
                                const std::vector<nlohmann::json>& per_rank, CheckList& checks) {
    const std::vector<nlohmann::json> want = expect(p, world);
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& e = want[static_cast<size_t>(r)];
      checks.CheckEqual(RankName(r) + " saved keys (as a set)",
                        Sorted(e["saved_keys"].get<std::vector<std::string>>()),
                        Sorted(RankObservation(per_rank, r, "saved_keys").get<std::vector<std::string>>()));
      CheckRankEqual(checks, per_rank, r, {"uncopied", "values not copied", e["uncopied"]});
      CheckRankEqual(checks, per_rank, r, {"buffer_dtypes", "buffer dtypes", e["buffer_dtypes"]});
      CheckRankTensorsExact(checks, per_rank, r, e[kTensors]);
    }
  };
  return s;
}

}  // namespace

void RegisterFsdpStateDictScenarios(ScenarioRegistry& registry) {
  registry.Add(MakeRoundTrip(
      {"basic_save_and_load_state_dict", "test_basic_save_and_load_state_dict",
       "the multi-buffer nested model: save, load into a zeroed copy; keys, values and the "
       "loaded model vs the weights",
       "multibuffer_nested",
       {TypeAxis(kAllTypes), BoolAxis("cpu_offload", "CPUOffload(offload_params=...)"),
        BoolAxis("mixed_precision", "MixedPrecision(float16 x 3) (the seed's fp16)"),
        BoolAxis("state_dict_rank0_and_offload", "rank0_only and offload_to_cpu"),
        ParamSpec::Axis("use_orig_params", "FSDP's use_orig_params", {"True", "False"})},
       UnsupportedBySeed,
       {{3, {{"cpu_offload", "False"}, {"mixed_precision", "True"}}},
        {4, {{"use_orig_params", "False"}, {"cpu_offload", "True"}}},
        {1, {{"mixed_precision", "False"}}}}}));
  registry.Add(MakeRoundTrip(
      {"state_dict_with_shared_parameters", "test_state_dict_with_shared_parameters",
       "TransformerWithSharedParams (tied embedding and output weights), recursively wrapped: "
       "round trip of every state dict type",
       "transformer", {TypeAxis(kAllTypes)}, nullptr, {{3, {}}}}));
  registry.Add(MakeRoundTrip(
      {"fsdp_state_dict_keys", "test_fsdp_state_dict_keys",
       "the seed's Model (inner FSDP, outer Linear, persistent and non-persistent buffers): "
       "FULL/SHARDED keys equal the plain model's, LOCAL has _flat_param and inner._flat_param",
       "model", {TypeAxis(kAllTypes)}, nullptr, {{4, {}}}}));
  registry.Add(MakeRoundTrip(
      {"fsdp_state_dict_with_activation_checkpoint",
       "test_fsdp_state_dict_with_activation_checkpoint",
       "checkpoint_wrapper on the saving and/or loading model (before or after FSDP): "
       "_checkpoint_wrapped_module. never in keys, round trip exact",
       "simple_nested",
       {TypeAxis(kUnflattenedTypes),
        ParamSpec::Axis("checkpoint_wrap", "which models get activation checkpointing",
                        {"source", "dest", "both", "source_after_wrap", "both_after_wrap"}),
        BoolAxis("state_dict_rank0_and_offload", "rank0_only and offload_to_cpu"),
        ParamSpec::Axis("model", "_get_simple_model or _get_simple_nested_model",
                        {"simple", "simple_nested"})},
       UnsupportedBySeed, {}}));
  registry.Add(MakeRoundTrip(
      {"state_dict_load_into_local_module", "test_state_dict_load_into_local_module",
       "FULL / SHARDED dicts (pieces gathered, rank 0's dict broadcast) loaded into the plain "
       "model; the model's root is FSDP (the seed's Model) or not (FSDPContainer)",
       "model",
       {TypeAxis(kUnflattenedTypes),
        BoolAxis("state_dict_rank0_and_offload", "rank0_only and offload_to_cpu"),
        ParamSpec::Axis("model", "the seed's fsdp_root: True (Model) or False (FSDPContainer)",
                        {"model", "container"}),
        ParamSpec::SizeString("load_into", "the plain model", "local")},
       UnsupportedBySeed, {{3, {}}}}));
  registry.Add(MakeRoundTrip(
      {"state_dict_with_manual_ac_wrapper", "test_state_dict_with_manual_ac_wrapper",
       "TransformerWithSharedParams with FSDP(checkpoint_wrapper(layer)) by hand (or FSDP(layer)) "
       "and FSDP(transformer) under a plain root: keys and round trip",
       "transformer_manual",
       {TypeAxis(kUnflattenedTypes),
        BoolAxis("state_dict_rank0_and_offload", "rank0_only and offload_to_cpu"),
        ParamSpec::Axis("checkpoint_wrap", "both: the seed's model_ac; none: its model_no_ac",
                        {"both", "none"})},
       UnsupportedBySeed, {}}));
  registry.Add(MakeRoundTrip(
      {"local_state_dict_with_empty_ranks", "test_local_state_dict_with_empty_ranks",
       "a 1-element parameter: LOCAL pieces of ranks past the data are empty and round-trip",
       "one_element", {TypeAxis({"local_state_dict"})}, nullptr, {{3, {}}}}));
  registry.Add(MakeRoundTrip(
      {"torch_save_load", "test_torch_save_load",
       "a LOCAL dict through the file format (safetensors bytes) loads back exactly",
       "model",
       {TypeAxis({"local_state_dict"}),
        ParamSpec::SizeBool("through_file", "the saved dict goes through the file format", true)},
       nullptr, {}}));
  registry.Add(MakeRoundTrip(
      {"shared_module_and_shared_parameter", "test_shared_module_and_shared_parameter",
       "TestDummyModel (net3 is net2, shared_parameter is random_parameter): FULL has every "
       "name with equal values",
       "dummy", {}, nullptr, {}}));
  registry.Add(MakeRoundTrip(
      {"sharded_load_multi_backend_pg", "test_sharded_load_multi_backend_pg",
       "use_orig_params Transformer: SHARDED save, load (pieces moved to the CPU or not)",
       "transformer",
       {TypeAxis({"sharded_state_dict"}),
        ParamSpec::SizeBool("use_orig_params", "FSDP's use_orig_params", true),
        BoolAxis("load_cpu", "the pieces are moved to the CPU before loading")},
       nullptr, {}}));
  registry.Add(MakeRoundTrip(
      {"world_size_one", "test_world_size_one",
       "every rank wraps the Transformer over its own 1-rank group (NO_SHARD): a SHARDED "
       "request saves and loads a FULL dict",
       "transformer",
       {TypeAxis({"sharded_state_dict"}),
        ParamSpec::SizeString("load_into",
                            "fsdp (the same model wrapped, zeroed) or local (the plain model, "
                            "zeroed, after the seed's _gather_state_dict)",
                            "fsdp"),
      ParamSpec::SizeString("process_group", "each rank its own 1-rank group", "per_rank")},
       nullptr, {{3, {}}}}));
  registry.Add(Rank0OffloadSaveLoadFlow());
  registry.Add(StateDictSaveLoadFlow());
  registry.Add(SaveAndLoadAfterForward());
  registry.Add(StateDictWithIgnoredModules());
  registry.Add(LocalStateDictReshard());
  registry.Add(WrongStateDictConfig());
  registry.Add(StateDictTypeScopeScenario());
  registry.Add(MissingUnexpectedKeysCleaned());
}

}  // namespace fsdp::conformance
