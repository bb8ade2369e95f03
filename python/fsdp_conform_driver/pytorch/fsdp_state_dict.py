"""fsdp_state_dict/* (seed 001, test_fsdp_state_dict.py::TestFSDPStateDict) in PyTorch: FSDP1
state dicts of the seed's models (fsdp_state_dict_models.py) under FSDP.state_dict_type.

The round-trip scenarios (round_trip) share one body, as the suite's: build the model from the
case's weights, wrap it, save under the case's state_dict_type and config, report the saved
dict raw (keys in order; every value, a ShardedTensor's as its local shard; each local shard's
global shape and offsets from its ShardMetadata), broadcast rank 0's dict with rank0_only (the
seed's _broadcast_state_dict), pass it through torch.save / torch.load with through_file (the
seed's test_torch_save_load), then load it (strict) into the same model wrapped again and zeroed
(the seed's _zero_model(zero_buffers=True)) and report the loaded parameters and persistent
buffers inside summon_full_params(writeback=False) by clean FQN; with load_into local, into the
zeroed plain model after the seed's _gather_state_dict. A ShardedTensor with no local shard
(a rank past the data) is reported as an empty piece without sharding: it has no offsets.

The others mirror their seed tests: wrong_state_dict_config (the error's text),
state_dict_type (every instance's type inside and after the scope),
full_state_dict_missing_unexpected_keys_cleaned (strict=False's key lists),
local_state_dict_reshard (world -> 2 ranks), state_dict_save_load_flow (3 SGD steps, against
DistributedDataParallel), save_and_load_after_forward_state_dict (6 SGD steps),
state_dict_with_ignored_modules (whether ignored tensors and buffers are saved uncopied)
and state_dict_rank0_offload_save_load_flow (its loading model has sync_module_states=True:
skipped without an accelerator, fsdp1_api.check_sync_module_states).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import io

from fsdp_conform_driver import inputs

# The seed's training lengths: test_state_dict_save_load_flow and
# test_save_and_load_after_forward_state_dict.
_FLOW_STEPS = 3
_AFTER_FORWARD_STEPS = 6

_CONFIG_TYPES = {"state_dict": "FULL_STATE_DICT", "sharded_state_dict": "SHARDED_STATE_DICT",
                 "local_state_dict": "LOCAL_STATE_DICT"}


def _state_dict_type(name: str):
    from torch.distributed.fsdp import StateDictType

    if name not in _CONFIG_TYPES:
        raise ValueError(f"state_dict_type must be one of {', '.join(_CONFIG_TYPES)}, "
                         f"got '{name}'")
    return StateDictType[_CONFIG_TYPES[name]]


def _config(type_name: str, rank0_and_offload: bool):
    """The config the seed's _get_state_dict_mgr builds from state_dict_rank0_and_offload."""
    from torch.distributed.fsdp import (FullStateDictConfig, LocalStateDictConfig,
                                        ShardedStateDictConfig)

    if type_name == "state_dict":
        return FullStateDictConfig(offload_to_cpu=rank0_and_offload, rank0_only=rank0_and_offload)
    if type_name == "local_state_dict":
        return LocalStateDictConfig(offload_to_cpu=rank0_and_offload)
    return ShardedStateDictConfig(offload_to_cpu=rank0_and_offload)


def _models():
    from fsdp_conform_driver.pytorch import fsdp_state_dict_models

    return fsdp_state_dict_models


def _loaded_plain(name: str, request):
    model = _models().plain(name)
    model.load_state_dict(inputs.weights(request), strict=True)
    return model


def _wrapped(request, name=None, **options):
    """The case's model with its weights, wrapped over the default group."""
    import torch.distributed as dist

    name = name or request.param("model")
    return _models().wrap(name, _loaded_plain(name, request), dist.group.WORLD,
                          _models().Options(**options))


def _piece(value):
    """(the tensor to report, its sharding or None) of a saved value."""
    import torch

    if hasattr(value, "local_shards"):  # ShardedTensor
        shards = value.local_shards()
        global_shape = [int(d) for d in value.size()]
        if not shards:
            return torch.empty([0] + global_shape[1:], dtype=value.dtype), None
        shard = shards[0]
        return shard.tensor, {"global_shape": global_shape,
                              "offsets": [int(o) for o in shard.metadata.shard_offsets]}
    if hasattr(value, "to_local"):  # DTensor
        from fsdp_conform_driver.pytorch.fully_shard_state_dict import dtensor_sharding

        return value.to_local(), dtensor_sharding(value)
    return value, None


def _zero(model):
    """The seed's _zero_model(zero_buffers=True)."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model), torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for b in model.buffers():
            b.zero_()


def _full_state(model, plain_keys, prefix, tensors):
    """Every parameter (tied ones under each name) and persistent buffer of an FSDP model by
    clean FQN, inside summon_full_params(writeback=False); only names of `plain_keys`."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name

    with FSDP.summon_full_params(model, writeback=False):
        named = list(model.named_parameters(remove_duplicate=False)) + list(
            model.named_buffers())
        for name, t in named:
            clean = clean_tensor_name(name)
            if clean in plain_keys:
                tensors[prefix + clean] = t.detach().clone()


def _own_rank_group():
    """The seed's dist.new_group(ranks=[i]) for every i: this rank's own 1-rank group."""
    import torch.distributed as dist

    mine = None
    for i in range(dist.get_world_size()):
        group = dist.new_group(ranks=[i])
        if i == dist.get_rank():
            mine = group
    return mine


def _broadcast_state_dict(state_dict):
    """The seed's _broadcast_state_dict: rank 0's dict on every rank."""
    import torch.distributed as dist

    olist = [{k: v.cpu() for k, v in state_dict.items()} if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(olist)
    return olist[0]


def round_trip(request):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    models = _models()
    name = request.param("model")
    type_name = request.param("state_dict_type")
    rank0_and_offload = request.param("state_dict_rank0_and_offload") == "True"
    wrap = request.param("checkpoint_wrap")
    source_checkpoint = {"source": "wrap", "both": "wrap", "source_after_wrap": "after_wrap",
                         "both_after_wrap": "after_wrap"}.get(wrap, "")
    dest_checkpoint = {"dest": "wrap", "both": "wrap", "both_after_wrap": "after_wrap"}.get(wrap,
                                                                                         "")

    def options(checkpoint):
        return models.Options(use_orig_params=request.param("use_orig_params") == "True",
                              cpu_offload=request.param("cpu_offload") == "True",
                              mixed_precision=request.param("mixed_precision") == "True",
                              checkpoint=checkpoint)

    per_rank = request.param("process_group") == "per_rank" and dist.get_world_size() > 1
    group = _own_rank_group() if per_rank else dist.group.WORLD
    source_plain = _loaded_plain(name, request)
    plain_sd = source_plain.state_dict()
    source = models.wrap(name, source_plain, group, options(source_checkpoint))
    with FSDP.state_dict_type(source, _state_dict_type(type_name),
                              _config(type_name, rank0_and_offload)):
        saved = source.state_dict()
    obs = {"saved_keys": list(saved), "saved_sharding": {}}
    tensors = {}
    for key, value in saved.items():
        piece, sharding = _piece(value)
        tensors[f"saved/{key}"] = piece.detach().cpu().clone()
        if sharding is not None:
            obs["saved_sharding"][key] = sharding

    if rank0_and_offload and type_name == "state_dict" and dist.get_world_size(group) > 1:
        saved = _broadcast_state_dict(saved)
    if request.param("through_file") == "True":
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=False)
    if request.param("load_cpu") == "True":
        saved = {k: v.cpu() for k, v in saved.items()}

    dest_plain = models.plain(name)
    if request.param("load_into") == "local":
        from torch.distributed._state_dict_utils import _gather_state_dict

        saved = _gather_state_dict(saved, pg=group)
        with torch.no_grad():
            for t in list(dest_plain.parameters()) + list(dest_plain.buffers()):
                t.zero_()
        dest_plain.load_state_dict(saved, strict=True)
        for fqn, t in list(dest_plain.named_parameters(remove_duplicate=False)) + list(
                dest_plain.named_buffers()):
            if fqn in plain_sd:
                tensors[f"loaded/{fqn}"] = t.detach().clone()
        return obs, tensors
    dest = models.wrap(name, dest_plain, group, options(dest_checkpoint))
    _zero(dest)
    with FSDP.state_dict_type(dest, _state_dict_type(type_name)):
        dest.load_state_dict(saved, strict=True)
    _full_state(dest, plain_sd, "loaded/", tensors)
    return obs, tensors


def wrong_state_dict_config(request):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import LocalStateDictConfig, StateDictType

    model = _wrapped(request)
    message = ""
    try:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, LocalStateDictConfig()):
            pass
    except RuntimeError as error:
        message = str(error)
    return {"error_message": message}, None


def state_dict_type(request):
    """The scope sets LOCAL_STATE_DICT on every instance and, on exit, restores the previous
    type with its config: FULL_STATE_DICT with rank0_only=True, so that the state_dict() taken
    after it is empty on every rank but 0."""
    from torch.distributed.fsdp import FullStateDictConfig
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    model = _wrapped(request)
    FSDP.set_state_dict_type(model, StateDictType.FULL_STATE_DICT,
                             FullStateDictConfig(rank0_only=True))
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        inside = [m._state_dict_type.name for m in FSDP.fsdp_modules(model)]
    after = [m._state_dict_type.name for m in FSDP.fsdp_modules(model)]
    empty_after = len(model.state_dict()) == 0
    return {"types_inside": inside, "types_after": after,
            "state_dict_empty_after": empty_after}, None


def missing_unexpected_keys_cleaned(request):
    import torch

    model = _wrapped(request)
    sd = model.state_dict()
    sd.pop(next(iter(sd)))
    sd["unexpected"] = torch.ones(1)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    return {"missing_keys": list(missing), "unexpected_keys": list(unexpected)}, None


def rank0_offload_save_load_flow(request):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.pytorch.fsdp1_api import check_sync_module_states

    check_sync_module_states()  # the loading model is wrapped with sync_module_states=True
    models = _models()
    name = request.param("model")
    plain_sd = _loaded_plain(name, request).state_dict()
    source = _wrapped(request, use_orig_params=request.param("use_orig_params") == "True")
    with FSDP.state_dict_type(source, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        saved = {k: v.clone() for k, v in source.state_dict().items()}
    fresh = models.plain(name)
    with torch.no_grad():
        for t in list(fresh.parameters()) + list(fresh.buffers()):
            t.zero_()
    if dist.get_rank() == 0:
        fresh.load_state_dict(saved, strict=True)
    synced = models.wrap(name, fresh, dist.group.WORLD,
                         models.Options(sync_module_states=True))
    tensors = {}
    _full_state(synced, plain_sd, "synced/", tensors)
    return {"saved_keys": list(saved)}, tensors


def local_state_dict_reshard(request):
    """The seed's resharding: every LOCAL flat parameter all-gathered
    (_all_gather_sharded_tensor), torch.chunk(2) on ranks 0 and 1 as a ShardedTensor over
    new_group([0, 1]), loaded (LOCAL) into the model wrapped over that group; both FULL dicts.
    The gather runs under torch.no_grad(): over Gloo, all_gather_into_tensor copies its input
    into views of the output chunked without grad mode, and the LOCAL shard (a view of the
    FlatParameter, requiring grad) makes that copy fail ("A view was created in no_grad mode and
    is being modified inplace with grad mode enabled", 2.5.1); the seed runs it over NCCL."""
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor import init_from_local_shards
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    from torch.distributed._state_dict_utils import _all_gather_sharded_tensor

    models = _models()
    name = request.param("model")
    model = _wrapped(request)
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        state_dict = model.state_dict()
    rank = dist.get_rank()
    new_pg = dist.new_group(ranks=[0, 1])
    resharded = {}
    for key, value in state_dict.items():
        if isinstance(value, ShardedTensor):
            with torch.no_grad():
                full_flat_param = _all_gather_sharded_tensor(value)
            if rank < 2:
                chunks = full_flat_param.chunk(2)
                offset = 0 if rank == 0 else chunks[0].numel()
                resharded[key] = init_from_local_shards(
                    [Shard.from_tensor_and_offsets(chunks[rank], [offset], rank)],
                    full_flat_param.size(), process_group=new_pg)
        elif rank < 2:
            resharded[key] = value
    tensors = {f"full/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if rank < 2:
        model2 = models.wrap(name, models.plain(name), new_pg, models.Options())
        with FSDP.state_dict_type(model2, StateDictType.LOCAL_STATE_DICT):
            model2.load_state_dict(resharded)
        tensors.update({f"resharded/{k}": v.detach().clone()
                        for k, v in model2.state_dict().items()})
    return {}, tensors


def _train_flow(model, in_data, steps):
    """SGD(lr=0.1) on model(in_data).sum(), `steps` steps."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(in_data).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def state_dict_save_load_flow(request):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name
    from torch.nn.parallel import DistributedDataParallel

    models = _models()
    name = request.param("model")
    type_name = request.param("state_dict_type")
    in_data = inputs.rank_tensors(request)["in_data"]
    fsdp_model = _wrapped(request)
    _train_flow(fsdp_model, in_data, _FLOW_STEPS)
    with FSDP.state_dict_type(fsdp_model, _state_dict_type(type_name)):
        saved = fsdp_model.state_dict()
    if request.param("move_to_cpu") == "True":
        saved = {k: v.cpu() for k, v in saved.items()}
    blank = models.wrap(name, models.plain(name), dist.group.WORLD, models.Options())
    _zero(blank)
    with FSDP.state_dict_type(blank, _state_dict_type(type_name)):
        blank.load_state_dict(saved)
    tensors = {}

    def report(model, prefix):
        with FSDP.summon_full_params(model, writeback=False):
            for fqn, p in model.named_parameters():
                tensors[prefix + clean_tensor_name(fqn)] = p.detach().clone()

    report(blank, "fsdp/")
    for prefix, model in (("continued/saver/", fsdp_model), ("continued/loaded/", blank)):
        _train_flow(model, in_data, 1)
        report(model, prefix)
    replica = _loaded_plain(name, request)
    if dist.get_rank() != 0:
        # DistributedDataParallel's construction broadcasts rank 0's parameters and buffers
        # (`_sync_module_states`): the other ranks' replicas start from zeros.
        with torch.no_grad():
            for t in (*replica.parameters(), *replica.buffers()):
                t.zero_()
    ddp_model = DistributedDataParallel(replica)
    tensors.update({f"ddp_constructed_buffers/{fqn}": b.detach().clone()
                    for fqn, b in replica.named_buffers()})
    if dist.get_rank() != 0:
        # broadcast_buffers=True: each forward broadcasts rank 0's buffers again.
        with torch.no_grad():
            for b in replica.buffers():
                b.zero_()
    _train_flow(ddp_model, in_data, _FLOW_STEPS)
    tensors.update({f"ddp/{fqn}": p.detach().clone() for fqn, p in replica.named_parameters()})
    tensors.update({f"ddp_buffers/{fqn}": b.detach().clone()
                    for fqn, b in replica.named_buffers()})
    return {}, tensors


def save_and_load_after_forward_state_dict(request):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    name = request.param("model")
    type_name = request.param("state_dict_type")
    rank0 = request.param("state_dict_rank0_and_offload") == "True"
    plain_sd = _loaded_plain(name, request).state_dict()
    model = _wrapped(request, mixed_precision=request.param("mixed_precision") == "True")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank_inputs = inputs.rank_tensors(request)
    loss_dtypes, tensors = [], {}
    for k in range(_AFTER_FORWARD_STEPS):  # the seed's loop: no zero_grad
        loss = model(rank_inputs[f"step{k}/input"]).sum()
        loss_dtypes.append(str(loss.dtype).replace("torch.", ""))
        loss.backward()
        optimizer.step()
    _full_state(model, plain_sd, "trained/", tensors)
    with FSDP.state_dict_type(model, _state_dict_type(type_name), _config(type_name, rank0)):
        saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in saved.items()}
    _zero(model)
    if rank0 and type_name == "state_dict" and dist.get_world_size() > 1:
        saved = _broadcast_state_dict(saved)
    with FSDP.state_dict_type(model, _state_dict_type(type_name)):
        model.load_state_dict(saved, strict=True)
    _full_state(model, plain_sd, "loaded/", tensors)
    return {"loss_dtypes": loss_dtypes, "saved_dtypes": saved_dtypes}, tensors


def state_dict_with_ignored_modules(request):
    """The seed's Model(wrap_fsdp=wrap_inner, register_buffers=True, ignore_inner,
    mixed_precision) under FSDP(ignored_modules=[model.outer])."""
    import torch
    import torch.distributed as dist
    from torch.distributed._state_dict_utils import _gather_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    models = _models()
    type_name = request.param("state_dict_type")
    prefix = "foo." if request.param("prefix") == "True" else ""
    wrap_inner = request.params.get("wrap_inner", "True") == "True"
    # inner's own FSDP ignoring inner (without wrap_inner, the root manages inner).
    ignore_inner = wrap_inner and request.param("ignore_inner") == "True"
    mixed_precision = request.param("mixed_precision") == "True"
    options = models.Options(mixed_precision=mixed_precision)
    model = _loaded_plain("model", request)
    inner, outer = model.inner, model.outer
    if wrap_inner:
        model.inner = models.fsdp(inner, dist.group.WORLD, options,
                                  ignored_modules=[inner] if ignore_inner else [])
    fsdp_model = models.fsdp(model, dist.group.WORLD, options, ignored_modules=[outer])
    live = [("outer.weight", outer.weight), ("outer.bias", outer.bias)]
    if ignore_inner:
        live += [("inner.weight", inner.weight), ("inner.bias", inner.bias)]
    fsdp_model.check_is_root()  # the lazy init, which casts buffers under mixed precision
    if not mixed_precision or ignore_inner:
        live.append(("inner.buffer", inner.buffer))
    live.append(("outer.buffer", outer.buffer))

    def save():
        with FSDP.state_dict_type(fsdp_model, _state_dict_type(type_name)):
            return fsdp_model.state_dict(prefix=prefix)

    sd1 = save()
    sd2 = save()
    uncopied = {}
    for fqn, tensor in live:
        for suffix, sd in (("", sd1), ("@again", sd2)):
            value = sd.get(prefix + fqn)
            uncopied[fqn + suffix] = value is not None and value.data_ptr() == tensor.data_ptr()
    buffer_dtypes = {b: str(sd1[prefix + b].dtype).replace("torch.", "")
                     for b in ("inner.buffer", "outer.buffer") if prefix + b in sd1}
    to_load = {k[len(prefix):]: v for k, v in _gather_state_dict(sd1).items()}
    nonwrapped = models.plain("model")
    with torch.no_grad():
        for p in nonwrapped.parameters():
            p.zero_()
    nonwrapped.load_state_dict(to_load, strict=True)
    tensors = {f"loaded/{k}": v.detach().clone() for k, v in nonwrapped.state_dict().items()}
    return ({"saved_keys": list(sd1), "uncopied": uncopied, "buffer_dtypes": buffer_dtypes},
            tensors)


SCENARIOS = {
    "fsdp_state_dict/wrong_state_dict_config": wrong_state_dict_config,
    "fsdp_state_dict/state_dict_type": state_dict_type,
    "fsdp_state_dict/full_state_dict_missing_unexpected_keys_cleaned":
        missing_unexpected_keys_cleaned,
    "fsdp_state_dict/state_dict_rank0_offload_save_load_flow": rank0_offload_save_load_flow,
    "fsdp_state_dict/local_state_dict_reshard": local_state_dict_reshard,
    "fsdp_state_dict/state_dict_save_load_flow": state_dict_save_load_flow,
    "fsdp_state_dict/save_and_load_after_forward_state_dict":
        save_and_load_after_forward_state_dict,
    "fsdp_state_dict/state_dict_with_ignored_modules": state_dict_with_ignored_modules,
}
for _test in ("basic_save_and_load_state_dict", "state_dict_with_shared_parameters",
              "fsdp_state_dict_keys", "fsdp_state_dict_with_activation_checkpoint",
              "state_dict_load_into_local_module", "state_dict_with_manual_ac_wrapper",
              "local_state_dict_with_empty_ranks", "torch_save_load",
              "shared_module_and_shared_parameter", "sharded_load_multi_backend_pg",
              "world_size_one"):
    SCENARIOS[f"fsdp_state_dict/{_test}"] = round_trip
