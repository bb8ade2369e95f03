"""fully_shard_mixed_precision/* in PyTorch (test_fully_shard_mixed_precision.py): each case a
training plan (fully_shard_plan.run) on MLPStack in float32 with the MixedPrecisionPolicy the
scenario's C++ decoder (conformance/fully_shard_mixed_precision_scenarios.cc) builds:

  compute_dtype               param_dtype on every fully_shard call
  reduce_dtype                param_dtype and reduce_dtype on every call
  grad_acc_with_reduce_dtype  the same, micro-batches without gradient sync but the last
  output_dtype                param_dtype on every call, output_dtype on the root's
  float16_on_one_submodule    blocks 0 and 1 with param_dtype, output_dtype float32 and
                              cast_forward_inputs; the root without mixed precision
  low_precision_blocks_kwargs the same policies on every block of the Transformer, which calls
                              its blocks as layer(x=h) (block_kwargs)
  compute_dtype_token_ids     param_dtype on every call of the Transformer (each block, the
                              root), whose root takes int64 token ids

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import dataclasses

from fsdp_conform_driver.pytorch import fully_shard_plan


def _plan(request, **fields):
    """The suite's plan base on MLPStack (steps, lr) with `fields` set."""
    return dataclasses.replace(fully_shard_plan.plan_base(request, "mlp_stack"), **fields)


def _policy(request, *keys):
    """The case's MixedPrecisionPolicy fields among `keys` (dtype names, "None" for None)."""
    return {key: request.param(key) for key in keys}


def compute_dtype(request):
    return fully_shard_plan.run(request, _plan(request, mp_policy=_policy(request, "param_dtype")))


def reduce_dtype(request):
    return fully_shard_plan.run(
        request, _plan(request, mp_policy=_policy(request, "param_dtype", "reduce_dtype")))


def grad_acc_with_reduce_dtype(request):
    # As the seed: set_reshard_after_backward(is_last_microbatch or reshard_after_forward).
    reshard = request.param("reshard_after_forward") == "True"
    return fully_shard_plan.run(
        request, _plan(request, mp_policy=_policy(request, "param_dtype", "reduce_dtype"),
                      micro_batches=request.int_param("micro_batches"),
                      accumulate_without_sync=True, reshard_after_forward=reshard,
                      no_reshard_after_backward=not reshard))


def output_dtype(request):
    policy = _policy(request, "param_dtype")
    root = dict(policy, output_dtype=request.param("output_dtype"))
    return fully_shard_plan.run(
        request, _plan(request, mp_policy=policy, group_mp_policies={"": root}))


def _low_precision_groups(request, plan):
    """`plan` with its groups in the case's param_dtype, casting their inputs down and their
    outputs back to the parameters' dtype, under a full-precision root."""
    low = {"param_dtype": request.param("param_dtype"), "output_dtype": request.param("dtype"),
           "cast_forward_inputs": True}
    plan.group_mp_policies = {fqn: low for fqn in plan.groups}
    return fully_shard_plan.run(request, plan)


def float16_on_one_submodule(request):
    return _low_precision_groups(request, _plan(request))


def low_precision_blocks_kwargs(request):
    plan = fully_shard_plan.plan_base(request, "transformer")
    plan.groups = [f"layers.{i}" for i in range(request.int_param("n_layers"))]
    return _low_precision_groups(request, plan)


def compute_dtype_token_ids(request):
    plan = fully_shard_plan.plan_base(request, "transformer")
    plan.groups = [f"layers.{i}" for i in range(request.int_param("n_layers"))]
    plan.mp_policy = _policy(request, "param_dtype")
    return fully_shard_plan.run(request, plan)


SCENARIOS = {
    "fully_shard_mixed_precision/compute_dtype": compute_dtype,
    "fully_shard_mixed_precision/reduce_dtype": reduce_dtype,
    "fully_shard_mixed_precision/grad_acc_with_reduce_dtype": grad_acc_with_reduce_dtype,
    "fully_shard_mixed_precision/output_dtype": output_dtype,
    "fully_shard_mixed_precision/float16_on_one_submodule": float16_on_one_submodule,
    "fully_shard_mixed_precision/low_precision_blocks_kwargs": low_precision_blocks_kwargs,
    "fully_shard_mixed_precision/compute_dtype_token_ids": compute_dtype_token_ids,
}
