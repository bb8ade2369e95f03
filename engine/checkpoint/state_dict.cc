#include "engine/checkpoint/state_dict.h"

#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::checkpoint {

namespace {

using GroupOf = std::map<std::string, distributed::ProcessGroup*>;

std::string Quoted(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "\"" : ", \"") + k + "\"";
  return out;
}

int GlobalRank() {
  return distributed::HasDefaultProcessGroup() ? distributed::GetDefaultProcessGroup()->rank() : 0;
}

distributed::ProcessGroup& ShardGroup(const fsdp2::FsdpParam& param) {
  FSDP_CHECK(param.mesh_info().shard_process_group != nullptr, "FSDP parameter ", param.fqn(),
             " has no shard process group");
  FSDP_CHECK(!param.is_dtensor(), "FSDP parameter ", param.fqn(), " is sharded over dp and tp ",
             param.tp_sharding()->placements_str(), ": full or resharded state dicts of FSDP2 x "
             "TP parameters are not implemented (use the module's state_dict(), whose values are "
             "the local shards with their global offsets, or FsdpParam::full_tensor())");
  return *param.mesh_info().shard_process_group;
}

// The dim along which `local` is one rank's piece of `entry`'s global tensor: FSDP2 shards one
// dim (Shard(0), or Shard(d) from shard_placement_fn), so the piece differs from the global
// tensor in that dim only (in none on one rank: dim 0).
int64_t ShardDim(const Tensor& local, const nn::ShardedEntry& entry) {
  for (int64_t d = 0; d < local.dim(); ++d) {
    if (entry.offsets[d] != 0 || local.size(d) != entry.global_shape[d]) return d;
  }
  return 0;
}

// The full tensor of a piece laid out by torch.chunk over `pg` (DTensor.full_tensor()): a
// Shard(0) piece is padded to the chunk rows, all-gathered and trimmed; a Shard(d > 0) piece
// (even by fully_shard's rule) is all-gathered along dim 0 and the ranks' pieces concatenated
// along d.
Tensor GatherFull(const std::string& key, const Tensor& local, const nn::ShardedEntry& entry,
                  distributed::ProcessGroup& pg) {
  const int64_t d = ShardDim(local, entry);
  if (d != 0) {
    const int64_t c = local.size(d);
    Shape piece_shape = entry.global_shape;
    piece_shape[d] = c;
    FSDP_CHECK(c * pg.size() == entry.global_shape[d] && entry.offsets[d] == c * pg.rank() &&
                   local.sizes() == piece_shape,
               key, ": the shard of shape ", ShapeStr(local.sizes()), " at offsets ",
               ShapeStr(entry.offsets), " is not the Shard(", d, ") piece of rank ", pg.rank(),
               " of ", pg.size(), " of a tensor of shape ", ShapeStr(entry.global_shape));
    Shape gathered_shape = local.sizes();
    gathered_shape[0] *= pg.size();
    Tensor gathered = Tensor::empty(gathered_shape, local.dtype(), local.device());
    pg.all_gather_into_tensor(gathered, local)->wait();
    std::vector<Tensor> pieces;
    pieces.reserve(pg.size());
    for (int k = 0; k < pg.size(); ++k) {
      pieces.push_back(ops::kernels::Narrow(gathered, 0, k * local.size(0), local.size(0)));
    }
    return ops::kernels::Cat(pieces, d);
  }
  const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(entry.global_shape, pg.rank(), pg.size());
  FSDP_CHECK(info.row_begin == entry.offsets[0] && info.sharded_shape == local.sizes(), key,
             ": the shard of shape ", ShapeStr(local.sizes()), " at offsets ",
             ShapeStr(entry.offsets), " is not torch.chunk's piece of rank ", pg.rank(), " of ",
             pg.size());
  Tensor padded = Tensor::zeros(info.padded_shard_shape, local.dtype(), local.device());
  if (info.rows > 0) padded.narrow(0, 0, info.rows).copy_(local);
  Shape gathered_shape = info.padded_shard_shape;
  gathered_shape[0] *= pg.size();
  Tensor gathered = Tensor::empty(gathered_shape, local.dtype(), local.device());
  pg.all_gather_into_tensor(gathered, padded)->wait();
  return gathered.narrow(0, 0, entry.global_shape[0]).clone();
}

// Applies full_state_dict and cpu_offload to a sharded dict whose sharded keys gather over
// `groups` (every rank calls this with the same keys in the same order).
nn::StateDict Finish(nn::StateDict sd, const GroupOf& groups, const StateDictOptions& options) {
  if (options.full_state_dict) {
    nn::StateDict full;
    full.metadata = sd.metadata;
    for (const auto& [key, value] : sd) {
      const nn::ShardedEntry* entry = sd.sharding(key);
      full.insert(key, entry == nullptr ? value : GatherFull(key, value, *entry, *groups.at(key)));
    }
    sd = std::move(full);
    // PyTorch: a full state dict with cpu_offload lives on rank 0 only.
    if (options.cpu_offload && GlobalRank() != 0) return nn::StateDict();
  }
  if (options.cpu_offload) {
    for (auto& [key, value] : sd) {
      if (!value.device().is_cpu()) value = value.to(Device::CPU());
    }
  }
  return sd;
}

// The piece of `full` (the global tensor of `key`) that `like` (this rank's value) holds.
Tensor LocalPiece(const std::string& key, const Tensor& full, const nn::StateDict& like) {
  const nn::ShardedEntry* entry = like.sharding(key);
  if (entry == nullptr) return full;
  const Tensor& local = like.at(key);
  const int64_t d = ShardDim(local, *entry);
  return ops::kernels::Narrow(full, d, entry->offsets[d], local.size(d));
}

// Why `sd` cannot load into a model whose own dict is `like` (empty when it can): missing and
// unexpected keys (strict) and global shapes, with PyTorch's wording.
std::string Mismatch(const nn::StateDict& like, const nn::StateDict& sd, bool full, bool strict) {
  std::vector<std::string> missing, unexpected, errors;
  for (const auto& [key, value] : like) {
    const Tensor* got = sd.find(key);
    if (got == nullptr) {
      missing.push_back(key);
      continue;
    }
    const nn::ShardedEntry* entry = like.sharding(key);
    const Shape want = full && entry != nullptr ? entry->global_shape : value.sizes();
    if (got->sizes() != want) {
      errors.push_back("size mismatch for " + key + ": copying a param with shape " +
                       ShapeStr(got->sizes()) + " from checkpoint, the shape in current model is " +
                       ShapeStr(want) + ".");
    }
  }
  for (const auto& [key, value] : sd) {
    if (like.find(key) == nullptr) unexpected.push_back(key);
  }
  std::string msg;
  if (strict && !missing.empty()) msg += "Missing key(s) in state_dict: " + Quoted(missing) + ". ";
  if (strict && !unexpected.empty()) {
    msg += "Unexpected key(s) in state_dict: " + Quoted(unexpected) + ". ";
  }
  for (const std::string& e : errors) msg += (msg.empty() ? "" : "\n\t") + e;
  return msg;
}

// The local (this rank's layout) dict to load for `sd` given the model's own dict `like`,
// checked before anything is loaded; broadcast from rank 0 when asked.
nn::StateDict ToLocal(const nn::StateDict& like, const nn::StateDict& sd,
                      const StateDictOptions& options, const std::string& what) {
  if (options.broadcast_from_rank0) {
    FSDP_CHECK(options.full_state_dict, what,
               ": broadcast_from_rank0 needs full_state_dict=True (PyTorch's requirement)");
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, distributed::HasDefaultProcessGroup(), what,
                    ": broadcast_from_rank0 needs the default process group");
    distributed::ProcessGroup& pg = *distributed::GetDefaultProcessGroup();
    const bool root = pg.rank() == 0;
    const std::string error = root ? Mismatch(like, sd, true, options.strict) : "";
    // Which keys rank 0 has, and whether its dict loads: one broadcast every rank waits on.
    // It travels on the group's device, as PyTorch's broadcast_object_list: a NCCL group
    // takes CUDA tensors only.
    const Device device = pg.default_device();
    Tensor present = Tensor::zeros({static_cast<int64_t>(like.size()) + 1}, DType::kInt64, device);
    if (root) {
      std::vector<int64_t> flags;
      for (const auto& [key, value] : like) flags.push_back(sd.find(key) != nullptr ? 1 : 0);
      flags.push_back(error.empty() ? 0 : 1);
      present = Tensor::from_int64s(flags, {static_cast<int64_t>(flags.size())}).to(device);
    }
    pg.broadcast(present, 0)->wait();
    const std::vector<int64_t> flags = present.to_int64s();
    FSDP_CHECK(flags.back() == 0, "Error(s) in loading state_dict for ", what, ":\n\t",
               root ? error : "rank 0's state dict does not match the model (see rank 0's error)");
    nn::StateDict local;
    size_t i = 0;
    for (const auto& [key, value] : like) {
      const nn::ShardedEntry* entry = like.sharding(key);
      if (flags[i++] == 0) {
        // A key rank 0's dict lacks (strict=False; strict raised above): PyTorch's
        // _broadcast_state_dict leaves the model's own value in the dict it loads, so the key
        // keeps its value and is not reported missing.
        local.insert(key, value.clone());
        if (entry != nullptr) local.sharded.insert(key, *entry);
        continue;
      }
      const Shape global = entry != nullptr ? entry->global_shape : value.sizes();
      Tensor full = root ? sd.at(key).to(value.dtype()).to(value.device())
                         : Tensor::empty(global, value.dtype(), value.device());
      if (root && full.is_same(sd.at(key))) full = full.clone();
      pg.broadcast(full, 0)->wait();
      local.insert(key, LocalPiece(key, full, like));
      if (entry != nullptr) local.sharded.insert(key, *entry);
    }
    return local;
  }
  const std::string error = Mismatch(like, sd, options.full_state_dict, options.strict);
  FSDP_CHECK(error.empty(), "Error(s) in loading state_dict for ", what, ":\n\t", error);
  if (!options.full_state_dict) return sd;
  // PyTorch's _load_model_state_dict updates the dict it loads with the model's own dict, each
  // value the rank's piece of the given one: under strict=False a key the dict lacks keeps the
  // model's value (not reported missing), and a key the model lacks stays (reported unexpected).
  nn::StateDict local;
  for (const auto& [key, value] : like) {
    const Tensor* given = sd.find(key);
    local.insert(key, given != nullptr ? LocalPiece(key, *given, like) : value.clone());
    if (const nn::ShardedEntry* entry = like.sharding(key)) local.sharded.insert(key, *entry);
  }
  for (const auto& [key, value] : sd) {
    if (like.find(key) == nullptr) local.insert(key, value);
  }
  return local;
}

// FQN of every parameter location (tied weights under each name) → its FSDP parameter.
std::map<std::string, fsdp2::FsdpParam*> FsdpParamsByFqn(const nn::Module& model) {
  std::map<std::string, fsdp2::FsdpParam*> out;
  for (const auto& [fqn, t] : model.named_parameters("", true, /*remove_duplicate=*/false)) {
    if (fsdp2::FsdpParam* p = fsdp2::LookupFsdpParam(t)) out[fqn] = p;
  }
  return out;
}

// The first FQN of each parameter (identity), as the optimizer state dict keys them.
std::map<const TensorImpl*, std::string> FirstFqns(const nn::Module& model) {
  std::map<const TensorImpl*, std::string> out;
  for (const auto& [fqn, t] : model.named_parameters()) out.emplace(t.impl(), fqn);
  return out;
}

std::string FqnOf(const std::map<const TensorImpl*, std::string>& fqns, const Tensor& param,
                  const optim::Optimizer& optimizer) {
  auto it = fqns.find(param.impl());
  FSDP_CHECK(it != fqns.end(), optimizer.name(), ": a parameter of the optimizer (",
             ShapeStr(param.sizes()), ") is not a parameter of the model");
  return it->second;
}

// The sharding of an optimizer state tensor of `param`: the parameter's, when the state has
// the parameter's (local) shape and the parameter is FSDP-managed.
const fsdp2::FsdpParam* ShardedLike(const Tensor& param, const Tensor& state) {
  const fsdp2::FsdpParam* p = fsdp2::LookupFsdpParam(param);
  return p != nullptr && state.dim() > 0 && state.sizes() == param.sizes() ? p : nullptr;
}

nn::ShardedEntry EntryOf(const fsdp2::FsdpParam& p) { return {p.tensor_shape(), p.tensor_offsets()}; }

constexpr const char* kStatePrefix = "state.";
constexpr const char* kGroupsPrefix = "param_groups.";

}  // namespace

nn::StateDict get_model_state_dict(nn::Module& model, const StateDictOptions& options) {
  nn::StateDict sd = model.state_dict();
  GroupOf groups;
  const auto params = FsdpParamsByFqn(model);
  for (const auto& [key, entry] : sd.sharded) {
    auto it = params.find(key);
    FSDP_CHECK(it != params.end(), "get_model_state_dict: ", key,
               " is sharded but not an FSDP2 parameter (FSDP1 modules use state_dict_type)");
    groups[key] = &ShardGroup(*it->second);
  }
  return Finish(std::move(sd), groups, options);
}

nn::IncompatibleKeys set_model_state_dict(nn::Module& model, const nn::StateDict& state_dict,
                                          const StateDictOptions& options) {
  const nn::StateDict like = model.state_dict();
  return model.load_state_dict(ToLocal(like, state_dict, options, model.type_name()),
                               options.strict);
}

nn::StateDict get_optimizer_state_dict(nn::Module& model, const optim::Optimizer& optimizer,
                                       const StateDictOptions& options) {
  const auto fqns = FirstFqns(model);
  nn::StateDict sd;
  GroupOf groups;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& param : group.params) {
      const std::string fqn = FqnOf(fqns, param, optimizer);
      if (optimizer.has_state(param)) {
        for (const auto& [name, value] : optimizer.state(param)) {
          const std::string key = kStatePrefix + fqn + "." + name;
          sd.insert(key, value);
          if (const fsdp2::FsdpParam* p = ShardedLike(param, value)) {
            sd.sharded.insert(key, EntryOf(*p));
            groups[key] = &ShardGroup(*p);
          }
        }
      }
      sd.insert(kGroupsPrefix + fqn + ".lr", Tensor::from_doubles({group.lr}, {}, DType::kFloat64));
    }
  }
  return Finish(std::move(sd), groups, options);
}

void set_optimizer_state_dict(nn::Module& model, optim::Optimizer& optimizer,
                              const nn::StateDict& state_dict, const StateDictOptions& options) {
  // What this optimizer's dict looks like here: the keys of every state tensor it has or will
  // have are those of state_dict for its parameters; the layout comes from each parameter.
  const auto fqns = FirstFqns(model);
  nn::StateDict like;
  std::vector<std::pair<Tensor, std::string>> params;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& param : group.params) {
      const std::string fqn = FqnOf(fqns, param, optimizer);
      params.emplace_back(param, fqn);
      const std::string state_prefix = kStatePrefix + fqn + ".";
      for (const auto& [key, value] : state_dict) {
        if (key.rfind(state_prefix, 0) != 0) continue;
        const bool full_shape = value.dim() > 0 && fsdp2::LookupFsdpParam(param) != nullptr &&
                                (options.full_state_dict
                                     ? value.sizes() == fsdp2::LookupFsdpParam(param)->tensor_shape()
                                     : value.sizes() == param.sizes());
        const Tensor local = full_shape ? Tensor::empty(param.sizes(), value.dtype()) : value;
        like.insert(key, local);
        if (full_shape) like.sharded.insert(key, EntryOf(*fsdp2::LookupFsdpParam(param)));
      }
      like.insert(kGroupsPrefix + fqn + ".lr", Tensor::zeros({}, DType::kFloat64));
    }
  }
  FSDP_CHECK(!options.broadcast_from_rank0, optimizer.name(),
             ": set_optimizer_state_dict with broadcast_from_rank0 is not supported (pass the "
             "full dict on every rank)");
  const nn::StateDict local = ToLocal(like, state_dict, options, optimizer.name());
  for (auto& [param, fqn] : params) {
    const std::string state_prefix = kStatePrefix + fqn + ".";
    nn::OrderedDict<Tensor> state;
    for (const auto& [key, value] : local) {
      if (key.rfind(state_prefix, 0) == 0) {
        Tensor v = value.clone();
        if (v.dim() > 0) v = v.to(param.device());
        state.insert(key.substr(state_prefix.size()), v);
      }
    }
    if (!state.empty()) optimizer.set_state(param, std::move(state));
  }
  for (optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& param : group.params) {
      if (const Tensor* lr = local.find(kGroupsPrefix + FqnOf(fqns, param, optimizer) + ".lr")) {
        group.lr = lr->item();
      }
    }
  }
}

}  // namespace fsdp::checkpoint
