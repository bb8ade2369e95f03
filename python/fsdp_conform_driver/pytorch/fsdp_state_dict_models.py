"""The models of seed 001 (test_fsdp_state_dict.py) for fsdp_state_dict/*, plain and wrapped
with FullyShardedDataParallel as the seed wraps them (conformance/fsdp_state_dict_models.h
names them; their state_dict() keys are the keys of the case's weights file):

  simple              FSDP(Linear(10, 10, bias=False))                       _get_simple_model
  simple_nested       FSDP(Sequential(FSDP(Linear), Linear)), no biases      _get_simple_nested_model
  multibuffer_nested  FSDP(Sequential(FSDP(Linear), FSDP(BatchNorm1d(10)), Linear))
  model               FSDP(Model): inner = FSDP(Linear(4, 4)), outer = Linear(4, 5), each with a
                      persistent `buffer` and a non-persistent one (register_buffers=True)
  transformer         TransformerWithSharedParams(add_bn=False), encoder and decoder layers
                      wrapped (ModuleWrapPolicy)
  dummy               FSDP(TestDummyModel): net3 is net2, shared_parameter is random_parameter
  one_element         FSDP(a module whose only parameter is [3.1415926])
  transformer_manual  FSDP(layer) (FSDP(checkpoint_wrapper(layer)) with checkpoint "wrap") for
                      every encoder and decoder layer, then FSDP(transformer); the root plain
  container           FSDPContainer: non_fsdp_lin plain, fsdp_1 and fsdp_2 simple_nested each

Options (the seed's fsdp_kwargs): use_orig_params, cpu_offload (fsdp1_api.cpu_offload_of: skipped
without an accelerator), mixed_precision (MixedPrecision(float16 x 3), BatchNorm's instance
float32), checkpoint "wrap" (checkpoint_wrapper before FSDP) or "after_wrap"
(apply_activation_checkpointing on the Linears of the wrapped model), sync_module_states
(fsdp1_api.check_sync_module_states). Every instance gets device_id=cpu (fsdp1_api.py).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

NAMES = ("simple", "simple_nested", "multibuffer_nested", "model", "transformer", "dummy",
         "one_element", "transformer_manual", "container")


@dataclasses.dataclass
class Options:
    use_orig_params: bool = False
    cpu_offload: bool = False
    mixed_precision: bool = False
    checkpoint: str = ""  # "", "wrap" or "after_wrap"
    sync_module_states: bool = False


class Model(nn.Module):
    """The seed's Model(wrap_fsdp, register_buffers) unwrapped: outer(inner(x) + inner(x)) (also
    the zoo's state_dict_model, whose register_buffers defaults to False)."""

    def __init__(self, register_buffers: bool = True) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 5)
        if register_buffers:
            for lin in (self.inner, self.outer):
                lin.register_buffer("buffer", torch.randn((5, 5)))
                lin.register_buffer("non_persistent_buffer", torch.randn((5, 5)),
                                    persistent=False)

    def forward(self, x):
        i = self.inner(x)
        j = self.inner(x)
        return self.outer(i + j)


class TestDummyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.net2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.net3 = self.net2
        self.random_parameter = nn.Parameter(torch.Tensor(10))
        self.shared_parameter = self.random_parameter

    def forward(self, x):
        return self.net3(self.net2(self.net1(x)))


class OneElementModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.my_parameter = nn.Parameter(torch.Tensor([3.1415926]))


class FSDPContainer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.non_fsdp_lin = nn.Linear(10, 10, bias=False)
        self.fsdp_1 = plain("simple_nested")
        self.fsdp_2 = plain("simple_nested")

    def forward(self, x):
        return self.fsdp_2(self.fsdp_1(self.non_fsdp_lin(x)))


def plain(name: str) -> nn.Module:
    """The plain model `name`."""
    from fsdp_conform_driver.pytorch.models import TransformerWithSharedParams

    if name == "simple":
        return nn.Linear(10, 10, bias=False)
    if name in ("simple_nested", "multibuffer_nested"):
        layers = [nn.Linear(10, 10, bias=False)]
        if name == "multibuffer_nested":
            layers.append(nn.BatchNorm1d(10))
        return nn.Sequential(*layers, nn.Linear(10, 10, bias=False))
    if name == "model":
        return Model()
    if name in ("transformer", "transformer_manual"):
        return TransformerWithSharedParams(add_bn=False)
    if name == "dummy":
        return TestDummyModel()
    if name == "one_element":
        return OneElementModel()
    if name == "container":
        return FSDPContainer()
    raise ValueError(f"fsdp_state_dict: unknown model '{name}'; models: {', '.join(NAMES)}")


def _mixed_precision(dtype):
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)


def fsdp(module, process_group, options: Options, mixed_precision=None, **kwargs):
    """FullyShardedDataParallel(module) over `process_group` with `options` (and kwargs)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from fsdp_conform_driver.pytorch.fsdp1_api import check_sync_module_states, cpu_offload_of

    if options.sync_module_states:
        check_sync_module_states()
    if mixed_precision is None and options.mixed_precision:
        mixed_precision = _mixed_precision(torch.float16)
    return FullyShardedDataParallel(
        module, process_group=process_group, use_orig_params=options.use_orig_params,
        cpu_offload=cpu_offload_of(options.cpu_offload),
        mixed_precision=mixed_precision, sync_module_states=options.sync_module_states,
        device_id=torch.device("cpu"), **kwargs)


def _maybe_checkpoint(module, options: Options):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    return checkpoint_wrapper(module) if options.checkpoint == "wrap" else module


def wrap(name: str, model: nn.Module, process_group, options: Options) -> nn.Module:
    """`model` (from plain(name)) wrapped as the seed wraps it over `process_group`."""
    if name == "container":
        model.fsdp_1 = wrap("simple_nested", model.fsdp_1, process_group, options)
        model.fsdp_2 = wrap("simple_nested", model.fsdp_2, process_group, options)
        return model
    if name == "transformer_manual":
        for stack in (model.transformer.encoder.layers, model.transformer.decoder.layers):
            for i, layer in enumerate(stack):
                stack[i] = fsdp(_maybe_checkpoint(layer, options), process_group, options)
        model.transformer = fsdp(model.transformer, process_group, options)
        return model
    if name in ("simple_nested", "multibuffer_nested"):
        model[0] = fsdp(_maybe_checkpoint(model[0], options), process_group, options)
        if name == "multibuffer_nested":
            bn_precision = _mixed_precision(torch.float32) if options.mixed_precision else None
            model[1] = fsdp(_maybe_checkpoint(model[1], options), process_group, options,
                             mixed_precision=bn_precision)
        last = len(model) - 1
        model[last] = _maybe_checkpoint(model[last], options)
        root = fsdp(_maybe_checkpoint(model, options), process_group, options)
    elif name == "model":
        model.inner = fsdp(model.inner, process_group, options)
        root = fsdp(model, process_group, options)
    elif name == "transformer":
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        root = fsdp(model, process_group, options, auto_wrap_policy=ModuleWrapPolicy(
            {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}))
    else:
        root = fsdp(_maybe_checkpoint(model, options), process_group, options)
    if options.checkpoint == "after_wrap":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)

        apply_activation_checkpointing(root, check_fn=lambda m: isinstance(m, nn.Linear))
    return root
