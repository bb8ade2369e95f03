"""parity/single/*, parity/fsdp/*, parity/fsdp1/* and parity/tp/* in PyTorch: the zoo model the case
names trained for `steps` steps on the case's inputs (step{k}/input), loss out.sum() or
(out * out).sum() (DoubleLinear's two outputs: (out1 * out2).sum() before loss_switch_step),
SGD with momentum (nesterov or not) or Adam, zero_grad(set_to_none=(step % 2 == 0)) as the
seeds (with lr_step_size N > 0, StepLR(step_size=N, gamma=0.1) after every step), reporting every step's loss and parameters (and,
under fully_shard, gradient shards and the final full parameters; under FullyShardedDataParallel,
the full parameters read in summon_full_params; under tensor parallelism with fully_shard,
the collectives of every step's forward and backward), as docs/observations.md lists them.
train_sharded and the shard plans (shard_children_then_root, shard_submodules_then_root,
shard_every_child_then_root) are the sharded parity the other FSDP2 families train with
(conformance/sharded_parity.h).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import contextlib

from fsdp_conform_driver import ScenarioSkipped, inputs
from fsdp_conform_driver.recorders import CommCounts

_DTYPES = {"float32": "float32", "float64": "float64"}


def _build(kind: str, request, dtype_name=None):
    """The zoo model `kind` of the case in PyTorch, in `dtype_name` (default: the case's dtype,
    float32 where it has none), loaded with the case's weights."""
    import torch

    from fsdp_conform_driver.pytorch.models import (MLP, DoubleLinear, GatedNorms, MLPModule,
                                                    MLPStack, ModelArgs, NontensorActivations,
                                                    OpMix, OpProducts, PaddedLM, SimpleModel,
                                                    TpExtensionModel, Transformer)

    dtype = getattr(torch, _DTYPES[dtype_name or request.params.get("dtype", "float32")])
    if kind == "mlp":
        model = MLP(request.int_param("dim"),
                    with_buffer=request.param("with_buffer").lower() == "true",
                    dim_multiplier=request.int_param("dim_multiplier"))
    elif kind == "transformer":
        model = Transformer(ModelArgs(
            n_layers=request.int_param("n_layers"), vocab_size=request.int_param("vocab_size"),
            max_seq_len=request.int_param("max_seq_len"), dim=request.int_param("dim"),
            n_heads=request.int_param("n_heads"), dropout_p=0.0,
            weight_tying=request.param("weight_tying").lower() == "true",
            block_kwargs=request.params.get("block_kwargs", "False") == "True",
            checkpoint_activations=request.params.get("checkpoint_activations",
                                                      "False") == "True"))
        if request.params.get("checkpoint_wrapper", "False") == "True":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing)

            from fsdp_conform_driver.pytorch.models import FeedForward, TransformerBlock
            apply_activation_checkpointing(
                model, check_fn=lambda module: isinstance(module, (TransformerBlock, FeedForward)))
    elif kind == "mlp_stack":
        model = MLPStack(request.int_param("mlp_dim"))
    elif kind == "mlp_stack_seq_parallel":
        model = MLPStack(request.int_param("mlp_dim"), with_seq_parallel=True)
    elif kind == "nontensor_activations":
        model = NontensorActivations(request.param("container_type"), request.int_param("dim"))
    elif kind == "double_linear":
        model = DoubleLinear(request.int_param("dim"),
                             use_second_linear=request.param("use_second_linear") == "True")
    elif kind == "mlp_module":
        model = MLPModule(bias=request.param("bias") == "True")
    elif kind == "mlp_rms_norm":
        model = TpExtensionModel(norm_last=request.params.get("norm_position", "first") == "last")
    elif kind == "tp_simple_model":
        model = SimpleModel()
    elif kind == "gated_norms":
        eps = request.params.get("rms_norm_eps", "None")
        model = GatedNorms(request.int_param("dim"), None if eps == "None" else float(eps))
    elif kind == "op_mix":
        model = OpMix(request.int_param("dim"))
    elif kind == "op_products":
        model = OpProducts(request.int_param("dim"))
    elif kind == "padded_lm":
        model = PaddedLM(request.int_param("vocab_size"), request.int_param("dim"),
                         request.int_param("n_heads"), request.int_param("seq_len"),
                         request.int_param("padding_idx"),
                         negative_padding_idx=request.params.get("negative_padding_idx",
                                                                 "False") == "True")
    elif kind == "state_dict_model":
        from fsdp_conform_driver.pytorch.fsdp_state_dict_models import Model

        model = Model(register_buffers=request.param("register_buffers") == "True")
    else:
        raise ScenarioSkipped(f"no PyTorch model for zoo kind '{kind}' in this driver")
    model.to(dtype)
    model.load_state_dict(inputs.weights(request), strict=True)
    return model, dtype


def _children_to_shard(root):
    """The modules the suite's sharded parity runs fully_shard before the root
    (conformance/sharded_parity.cc, ChildrenToShard): every element of a ModuleList child, and
    every other child that has parameters and shares none with another child (a tied
    embedding and output stay with the root)."""
    import torch

    children = list(root.children())
    ids = [{id(p) for p in c.parameters()} for c in children]
    out = []
    for i, child in enumerate(children):
        if isinstance(child, torch.nn.ModuleList):
            out.extend(child)
        elif ids[i] and not any(ids[i] & ids[j] for j in range(len(children)) if j != i):
            out.append(child)
    return out


def _optimizer(request, params):
    """SGD (momentum, nesterov, dampening), Adam or AdamW (decoupled decay, amsgrad), each with
    maximize and the case's weight_decay (0 where the scenario has no such parameter; nesterov,
    amsgrad and maximize False and dampening 0 likewise)."""
    import torch

    decay = float(request.param("weight_decay")) if "weight_decay" in request.params else 0.0
    optim = request.param("optim")
    amsgrad = request.params.get("amsgrad", "False") == "True"
    maximize = request.params.get("maximize", "False") == "True"
    if optim == "sgd":
        return torch.optim.SGD(params, lr=float(request.param("sgd_lr")),
                               momentum=float(request.param("momentum")), weight_decay=decay,
                               nesterov=request.params.get("nesterov", "False") == "True",
                               dampening=float(request.params.get("dampening", "0")),
                               maximize=maximize)
    if optim == "adamw":
        return torch.optim.AdamW(params, lr=float(request.param("adam_lr")), weight_decay=decay,
                                 amsgrad=amsgrad, maximize=maximize)
    return torch.optim.Adam(params, lr=float(request.param("adam_lr")), weight_decay=decay,
                            amsgrad=amsgrad, maximize=maximize)


def _scheduler(request, opt):
    """StepLR(opt, step_size=lr_step_size, gamma=0.1) where the scenario has lr_step_size > 0
    (parity/single/*), else None."""
    import torch

    step_size = int(request.params.get("lr_step_size", "0"))
    return torch.optim.lr_scheduler.StepLR(opt, step_size, gamma=0.1) if step_size > 0 else None


def _loss(request, k, out):
    """The loss of step k (ZooModel::LossAt): of a two-output model (DoubleLinear),
    (out1 * out2).sum() before loss_switch_step and of output switched_output (default 0) from
    it on; (out * out).sum() where the case's `loss` is "squares", else out.sum() (a scenario
    without that parameter)."""
    if isinstance(out, tuple):
        if k < request.int_param("loss_switch_step"):
            return (out[0] * out[1]).sum()
        out = out[int(request.params.get("switched_output", "0"))]
    return (out * out).sum() if request.params.get("loss") == "squares" else out.sum()


def _local(t):
    """A DTensor's local tensor (to_local()); any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _value(loss):
    """The rank's loss: of a DTensor loss (the Partial sum over tp of a sequence-sharded output)
    its local value, to_local() (the rank's sequence piece's loss)."""
    return _local(loss).item()


def _record_params(model, k, tensors):
    for name, p in model.named_parameters():
        tensors[f"step{k}/{name}"] = _local(p).detach().clone()


def _record_grad_shards(model, k, tensors):
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"grad{k}/{name}"] = _local(p.grad).detach().clone()


def _train(request, model, after_step=_record_params, after_backward=None, step_counts=None,
           before_step=None, backward_context=contextlib.nullcontext):
    """Trains `steps` steps; after_backward(model, k, tensors) and after_step(model, k, tensors)
    record what the scenario observes; before_step(model, obs) runs between them, before the
    optimizer step (clip_grad_norm_); every backward runs inside backward_context(); with a
    list `step_counts`, each step's collectives
    {"forward": {op: n}, "backward": {op: n}} are appended to it (CommCounts: the forward with
    its loss, the backward up to the gradient snapshot)."""
    opt = _optimizer(request, model.parameters())
    scheduler = _scheduler(request, opt)
    rank_inputs = inputs.rank_tensors(request)
    losses, tensors, loss_dtype = [], {}, None
    obs = {}
    for k in range(request.int_param("steps")):
        counts = CommCounts()
        phase = counts.phase if step_counts is not None else lambda _: contextlib.nullcontext()
        with phase("forward"):
            loss = _loss(request, k, model(rank_inputs[f"step{k}/input"]))
        loss_dtype = str(loss.dtype).replace("torch.", "")
        losses.append(_value(loss))
        with phase("backward"), backward_context():
            loss.backward()
        if step_counts is not None:
            step_counts.append(counts.by_phase("forward", "backward"))
        if after_backward is not None:
            after_backward(model, k, tensors)
        if before_step is not None:
            before_step(model, obs)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        opt.zero_grad(set_to_none=k % 2 == 0)
        after_step(model, k, tensors)
    obs.update({"losses": losses, "loss_dtype": loss_dtype})
    return obs, tensors


def single(kind: str):
    def run(request):
        model, _ = _build(kind, request)
        obs, tensors = _train(request, model)
        obs["param_names"] = [name for name, _ in model.named_parameters()]
        return obs, tensors
    return run


def fully_shard_kwargs(request):
    """fully_shard's options of the case: its reshard_after_forward (when the scenario has that
    parameter) and its shard_placement_fn (shard_placement_kwargs)."""
    from fsdp_conform_driver.pytorch.fsdp_api import (reshard_after_forward_of,
                                                      shard_placement_kwargs)

    kwargs = dict(shard_placement_kwargs(request, request.world))
    if "reshard_after_forward" in request.params:
        kwargs["reshard_after_forward"] = reshard_after_forward_of(request)
    return kwargs


def shard_children_then_root(model, **kwargs):
    """The suite's usual plan (ShardChildrenThenRoot): _children_to_shard, then the root."""
    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

    for child in _children_to_shard(model):
        fully_shard(child, **kwargs)
    fully_shard(model, **kwargs)


def shard_submodules_then_root(*fqns):
    """A plan (ShardSubmodulesThenRoot): fully_shard on the submodules `fqns` in order, then
    the root."""
    def plan(model, **kwargs):
        from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

        for fqn in fqns:
            fully_shard(model.get_submodule(fqn), **kwargs)
        fully_shard(model, **kwargs)
    return plan


def shard_every_child_then_root(model, **kwargs):
    """A plan (ShardEveryChildThenRoot): fully_shard on every direct child, parameter-less ones
    included (the seed's `for module in model: fully_shard(module)`), then the root."""
    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

    for child in model.children():
        fully_shard(child, **kwargs)
    fully_shard(model, **kwargs)


def train_sharded(request, kind, plan, train_context=contextlib.nullcontext):
    """Sharded parity (conformance/sharded_parity.h, RunShardedParityRank): zoo model `kind`
    with the case's weights, plan(model, **fully_shard_kwargs(request)), `steps` steps of
    _train inside train_context() recording gradient and parameter shards, then the full
    parameters (full_tensor(), outside train_context)."""
    model, _ = _build(kind, request)
    plan(model, **fully_shard_kwargs(request))
    with train_context():
        obs, tensors = _train(request, model, after_backward=_record_grad_shards)
    for name, p in model.named_parameters():
        tensors[f"full/{name}"] = p.full_tensor().detach().clone()
    return obs, tensors


def fsdp(kind: str):
    def run(request):
        return train_sharded(request, kind, shard_children_then_root)
    return run


def tp(kind: str):
    """parity/tp/*: tp_plans.plan over the "tp" dim, then fully_shard per block (less the norms
    the plan runs SequenceParallel on) and on the root over the "dp" dim (HSDP x TP with
    replicate > 1: over ("dp_replicate", "dp_shard")); with tp_src_only, ranks off tp index 0
    first zero the parameters the plan distribute_tensor-s (their src_data_rank=0 values win)."""
    def run(request):
        from fsdp_conform_driver.pytorch import tp_plans
        from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

        model, _ = _build(kind, request)
        mesh, dp_mesh = tp_plans.parity_mesh(request)
        if request.param("tp_src_only") == "True":
            tp_plans.zero_distributed_params_off_source(kind, model, mesh["tp"])
        tp_plans.parallelize(kind, model, mesh["tp"])
        for child in tp_plans.children_to_shard(kind, model, _children_to_shard(model)):
            fully_shard(child, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        step_counts = []
        obs, tensors = _train(request, model, after_backward=_record_grad_shards,
                              step_counts=step_counts)
        for name, p in model.named_parameters():
            tensors[f"full/{name}"] = p.full_tensor().detach().clone()
        obs["step_comm_counts"] = step_counts
        from fsdp_conform_driver.pytorch.fully_shard_state_dict import dtensor_sharding

        obs["state_dict_sharding"] = {key: dtensor_sharding(value)
                                      for key, value in model.state_dict().items()}
        return obs, tensors
    return run


def fsdp1(kind: str):
    """FullyShardedDataParallel around the model, nesting an instance around each child the
    suite nests (_children_to_shard, through lambda_auto_wrap_policy), with the case's
    sharding_strategy, backward_prefetch, use_orig_params, cpu_offload and mixed_precision;
    the hybrid strategies on the (replicate, shard) mesh of _hybrid_mesh_shape(world)."""
    def run(request):
        import torch

        from fsdp_conform_driver.pytorch.fsdp1_api import clean_fqn, nest_where, wrap

        sync_module_states = request.params.get("sync_module_states") == "True"
        if sync_module_states and not torch.cuda.is_available():
            raise ScenarioSkipped(
                "PyTorch's FullyShardedDataParallel(sync_module_states=True) refuses CPU "
                "parameters (ValueError: 'The module has CPU parameters or buffers when "
                "`sync_module_states=True`, which requires them to be on GPU', torch/distributed/"
                "fsdp/_init_utils.py _check_module_states_for_sync_module_states); no GPU here")
        model, _ = _build(kind, request)
        if sync_module_states and request.rank != 0:
            # Only rank 0 holds the weights: FSDP must broadcast them before sharding.
            with torch.no_grad():
                for p in model.parameters():
                    p.zero_()
        if request.params.get("mixed_strategy") == "True":
            fsdp_model = _wrap_mixed_strategy(request, model, sync_module_states)
        else:
            nested = {id(m) for m in _children_to_shard(model)}
            fsdp_model = wrap(request, model, nest_where(lambda m: id(m) in nested),
                              sync_module_states=sync_module_states)
        # use_orig_params: each original parameter is a view of its part of the rank's flat
        # shard (named without _fsdp_wrapped_module.).
        local_numels = ({clean_fqn(name): p.numel()
                         for name, p in fsdp_model.named_parameters()}
                        if request.param("use_orig_params") == "True" else {})
        clip = _clip_grad_norm(request)
        grad_dtypes, reduce_dtypes = set(), set()

        use_orig_params = request.param("use_orig_params") == "True"

        def before_step(model, obs):
            grad_dtypes.update(_dtype_name(p.grad) for p in model.parameters()
                               if p.grad is not None)
            # use_orig_params: the numels listed between the last backward and its step.
            obs["numels_before_step"] = ({clean_fqn(name): p.numel()
                                          for name, p in model.named_parameters()}
                                         if use_orig_params else {})
            if clip is not None:
                clip(model, obs)

        obs, tensors = _train(request, fsdp_model, after_step=record_full_params,
                              before_step=before_step,
                              backward_context=lambda: _recording_reduce_dtypes(reduce_dtypes))
        obs.setdefault("grad_norms", [])
        obs.setdefault("grad_norm_dtypes", [])
        obs.setdefault("numels_before_step", {})
        obs["local_numels"] = local_numels
        obs["grad_dtypes"] = sorted(grad_dtypes)
        obs["reduce_dtypes"] = sorted(reduce_dtypes)
        # use_orig_params: one more forward, then the parameters named_parameters() lists before
        # its backward (SHARD_GRAD_OP keeps listing the unsharded views the forward set).
        # use_orig_params: the user sets one gradient to None (_set_one_grad_to_none), then a
        # forward under no_grad (test_fsdp_fine_tune.py's evaluation forward between steps):
        # the sharded views whatever the strategy, and that gradient still None
        # (_is_grad_none_mask).
        numels_after_no_grad_forward, user_none_grad_kept, user_none_grad_restored = {}, True, True
        numels_after_forward = {}
        if request.param("use_orig_params") == "True":
            none_grad_param = _set_one_grad_to_none(fsdp_model)
            with torch.no_grad():
                fsdp_model(inputs.rank_tensors(request)["step0/input"])
            numels_after_no_grad_forward = {clean_fqn(name): p.numel()
                                            for name, p in fsdp_model.named_parameters()}
            user_none_grad_kept = none_grad_param is None or none_grad_param.grad is None
            loss = _loss(request, 0, fsdp_model(inputs.rank_tensors(request)["step0/input"]))
            numels_after_forward = {clean_fqn(name): p.numel()
                                    for name, p in fsdp_model.named_parameters()}
            # The backward gives that parameter a gradient again (_reset_is_grad_none).
            loss.backward()
            user_none_grad_restored = none_grad_param is None or none_grad_param.grad is not None
        obs["numels_after_no_grad_forward"] = numels_after_no_grad_forward
        obs["user_none_grad_kept"] = user_none_grad_kept
        obs["user_none_grad_restored"] = user_none_grad_restored
        obs["numels_after_forward"] = numels_after_forward
        return obs, tensors
    return run


def _wrap_mixed_strategy(request, model, sync_module_states):
    """test_fsdp_clip_grad_norm.py's "mixed_strategy": an instance around each child the suite
    nests, by hand (auto wrapping refuses modules already wrapped), the first with NO_SHARD and
    the others with the case's sharding_strategy, then the root's."""
    from fsdp_conform_driver.pytorch.fsdp1_api import wrap

    parents = {id(child): (parent, name) for parent in model.modules()
               for name, child in parent.named_children()}
    for i, child in enumerate(_children_to_shard(model)):
        parent, name = parents[id(child)]
        setattr(parent, name, wrap(request, child, None, sync_module_states=sync_module_states,
                                   sharding_strategy="NO_SHARD" if i == 0 else None))
    return wrap(request, model, None, sync_module_states=sync_module_states)


def _set_one_grad_to_none(model):
    """Sets the .grad of the first parameter with a non-empty local gradient whose module has
    another such parameter (so one of the same flat parameter, which keeps a gradient) to None;
    returns it, or None when there is none (conformance/parity_fsdp1_scenarios.cc,
    SetOneGradToNone)."""
    named = list(model.named_parameters())

    def has_local_grad(p):
        return p.numel() > 0 and p.grad is not None

    def module_of(fqn):
        return fqn.rsplit(".", 1)[0] if "." in fqn else ""

    for i, (name, p) in enumerate(named):
        if has_local_grad(p) and any(j != i and has_local_grad(q) and module_of(other) ==
                                     module_of(name) for j, (other, q) in enumerate(named)):
            p.grad = None
            return p
    return None


def _dtype_name(tensor):
    return str(tensor.dtype).replace("torch.", "")


@contextlib.contextmanager
def _recording_reduce_dtypes(dtypes):
    """Adds to `dtypes` the dtype of every reduce-scatter (torch.distributed.reduce_scatter_tensor,
    or reduce_scatter_single, which newer releases' FSDP1 calls) and all_reduce issued inside
    (FSDP1's gradient reductions call them through the module), as test_fsdp_mixed_precision.py
    patches them to check the reduce dtype."""
    import torch.distributed as dist

    saved = {name: getattr(dist, name)
             for name in ("reduce_scatter_tensor", "reduce_scatter_single", "all_reduce")
             if hasattr(dist, name)}

    def recording(original, index):
        def call(*args, **kwargs):
            dtypes.add(_dtype_name(args[index]))
            return original(*args, **kwargs)
        return call

    for name, original in saved.items():
        # (output, input, ...) for the reduce-scatters, (tensor, ...) for all_reduce
        setattr(dist, name, recording(original, 0 if name == "all_reduce" else 1))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def _clip_grad_norm(request):
    """clip_grad_norm "MAX_NORM:NORM_TYPE": the root's clip_grad_norm_ before every optimizer
    step, its total norm appended to obs["grad_norms"]; "none": nothing."""
    value = request.param("clip_grad_norm")
    if value == "none":
        return None
    max_norm, norm_type = value.split(":")

    def clip(model, obs):
        total = model.clip_grad_norm_(float(max_norm), float(norm_type))
        obs.setdefault("grad_norms", []).append(total.item())
        obs.setdefault("grad_norm_dtypes", []).append(_dtype_name(total))
    return clip


def record_full_params(model, k, tensors):
    """step{k}/{clean FQN}: FullyShardedDataParallel's full parameters after step k, read
    inside summon_full_params(writeback=False) (every rank must call it: it all-gathers)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=False):
        for name, p in model.named_parameters():
            tensors[f"step{k}/{name}"] = p.detach().clone()
