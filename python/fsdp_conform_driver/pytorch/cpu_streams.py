"""What PyTorch 2.4 / 2.5's FSDP2 needs to run without CUDA, and nothing more.

Those releases create CUDA streams unconditionally: FSDPCommContext.lazy_init raises
RuntimeError("FSDP requires CUDA for streams") when torch.cuda.is_available() is False, and the
all-gather, reduce-scatter and root pre-forward paths call torch.cuda.current_stream(),
torch.cuda.stream(s), torch.cuda.Event() and Stream.record_event() / wait_stream() /
wait_event(). On a CPU every kernel and every Gloo collective runs in program order on the
calling thread, so all of that is ordering the CPU already has. install() changes exactly:

  1. FSDPCommContext.lazy_init: the four streams (all_gather_copy_in_stream,
     all_gather_stream, reduce_scatter_stream, all_reduce_stream) are CpuStream objects; the
     rest of the method (all_gather_state, reduce_scatter_state, post_forward_order) as in
     PyTorch;
  2. torch.cuda.current_stream() returns a CpuStream; torch.cuda.stream(s) is a no-op
     context; torch.cuda.Event is CpuEvent.

CpuStream.wait_stream / wait_event / record_event / synchronize and CpuEvent.record / wait /
synchronize / query do nothing (query is True). Nothing else in FSDP2 is changed: its
sharding, collectives (Gloo all_gather_into_tensor / reduce_scatter_tensor), copy-in and
copy-out, hooks and state machine run as released. install() is a no-op when the release's
FSDPCommContext does not require CUDA (2.6 and later, which pick the device's own streams).

Ownership: patches module attributes for the life of the process (a driver process serves one
case). Thread-safety: call install() once, before fully_shard, on the main thread.
"""

from __future__ import annotations

import contextlib

import torch


class CpuEvent:
    """torch.cuda.Event on a CPU: every operation is already complete."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuStream:
    """torch.cuda.Stream on a CPU: one in-order stream, the calling thread."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> CpuEvent:
        return event if event is not None else CpuEvent()

    def synchronize(self) -> None:
        pass


_installed = False


def _comm_context_class():
    try:
        from torch.distributed._composable.fsdp._fsdp_param_group import FSDPCommContext
    except ImportError:
        return None
    return FSDPCommContext


def needed() -> bool:
    """Whether this torch's FSDP2 refuses to run without CUDA streams."""
    import inspect

    cls = _comm_context_class()
    return cls is not None and "FSDP requires CUDA for streams" in inspect.getsource(
        cls.lazy_init)


def install() -> bool:
    """Applies the changes above when needed(); returns whether it did."""
    global _installed
    if _installed:
        return True
    if not needed():
        return False
    cls = _comm_context_class()

    def lazy_init(self) -> None:
        self.all_gather_copy_in_stream = CpuStream()
        self.all_gather_stream = CpuStream()
        self.reduce_scatter_stream = CpuStream()
        self.all_reduce_stream = CpuStream()
        self.all_gather_state = None
        self.reduce_scatter_state = None
        self.post_forward_order = []

    cls.lazy_init = lazy_init
    cpu_stream = CpuStream()
    torch.cuda.current_stream = lambda device=None: cpu_stream
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.Event = CpuEvent
    _installed = True
    return True
