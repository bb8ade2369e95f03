"""Recorders that turn what PyTorch does into the suite's observations:

  CommCounts     collectives by phase, {"forward": {op key: n}, "backward": {...}}, from
                 torch's CommDebugMode (its keys, str(op packet), are the suite's op keys:
                 "c10d._allgather_base_", "c10d._reduce_scatter_base_", ...);
                 CommCounts(track_modules=False) counts without CommDebugMode's per-module
                 tracker (see _NoModuleTracker); CommCounts(with_bytes=True) also sums each
                 op's payload bytes by phase (bytes_by_phase; _CommBytesMode)
  FsdpEvents     every call of FSDP2's unshard / reshard / post_backward as the suite's events
                 [kind, module FQN (root ""), the group's training state as the call begins]
                 (calls that find the group already unsharded included), by wrapping FSDPParamGroup's
                 methods of those names for the recorder's lifetime

Ownership: a recorder owns the lists it fills; FsdpEvents restores FSDPParamGroup's methods
on exit. Thread-safety: one recorder per rank process, used from the main (autograd) thread.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List


class _NoModuleTracker:
    """Stands in for CommDebugMode's advanced_module_tracker (2.5's _CommModeModuleTracker)
    when only the totals are wanted: every collective is attributed to "Global". The real
    tracker fails on a module called twice in one forward (TransformerWithSharedParams'
    embed_tokens): its pre-hook registers a second forward hook on the module under the same
    name, both fire after the second call, parent_list is popped past "Global" and the forward
    raises IndexError in _fw_set_module_hook (2.5.1)."""

    name = "Global"
    is_bw = False
    activation_checkpointing = False

    def __init__(self) -> None:
        self.module_parents_dict = {"Global": set()}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _comm_bytes_mode_class():
    """_CommBytesMode, defined on first use (torch is imported lazily)."""
    global _CommBytesMode
    if _CommBytesMode is not None:
        return _CommBytesMode
    from torch.utils._python_dispatch import TorchDispatchMode

    try:  # torch >= 2.5
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor

    def payload(packet: str, args) -> int:
        """The full buffer of one c10d op, as the suite counts it: the all-gather's output, the
        reduce-scatter's input, the all-reduce's tensors."""
        if packet == "c10d._allgather_base_":
            tensors = [args[0]]
        elif packet == "c10d._reduce_scatter_base_":
            tensors = [args[1]]
        elif packet == "c10d.allreduce_":
            tensors = list(args[0])
        else:
            return 0
        return sum(t.numel() * t.element_size() for t in tensors)

    class Mode(TorchDispatchMode):
        """Sums the payload bytes of the c10d collectives dispatched inside, by op key."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes: Dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(t is DTensor for t in types):
                return NotImplemented  # let DTensor desugar into plain ops first (as CommDebugMode)
            packet = str(func._overloadpacket)
            if packet.startswith("c10d."):
                n = payload(packet, args)
                if n:
                    self.bytes[packet] = self.bytes.get(packet, 0) + n
            return func(*args, **kwargs)

    _CommBytesMode = Mode
    return Mode


_CommBytesMode = None


class CommCounts:
    """Counts the collectives of named phases: `with counts.phase("forward"): ...`; with
    `with_bytes`, also their payload bytes (bytes_by_phase)."""

    def __init__(self, track_modules: bool = True, with_bytes: bool = False) -> None:
        self.counts: Dict[str, Dict[str, int]] = {}
        self.bytes: Dict[str, Dict[str, int]] = {}
        self.track_modules = track_modules
        self.with_bytes = with_bytes

    @contextlib.contextmanager
    def phase(self, name: str):
        try:  # torch >= 2.5
            from torch.distributed.tensor.debug import CommDebugMode
        except ImportError:  # torch 2.4
            from torch.distributed._tensor.debug import CommDebugMode

        mode = CommDebugMode()
        if not self.track_modules and hasattr(mode, "advanced_module_tracker"):
            mode.advanced_module_tracker = _NoModuleTracker()
        bytes_mode = _comm_bytes_mode_class()() if self.with_bytes else contextlib.nullcontext()
        with mode, bytes_mode:
            yield
        phase = self.counts.setdefault(name, {})
        for op, n in mode.get_comm_counts().items():
            key = str(op)
            phase[key] = phase.get(key, 0) + int(n)
        if self.with_bytes:
            phase_bytes = self.bytes.setdefault(name, {})
            for key, n in bytes_mode.bytes.items():
                phase_bytes[key] = phase_bytes.get(key, 0) + n

    def by_phase(self, *names: str) -> Dict[str, Dict[str, int]]:
        """{name: {op key: n}} for each of `names` ({} for a phase with no collective)."""
        return {name: dict(self.counts.get(name, {})) for name in names}

    def bytes_by_phase(self, *names: str) -> Dict[str, Dict[str, int]]:
        """{name: {op key: payload bytes}} for each of `names` (with_bytes only)."""
        return {name: dict(self.bytes.get(name, {})) for name in names}


def _fsdp_param_group_class():
    try:  # torch >= 2.6
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # torch 2.4 / 2.5
        from torch.distributed._composable.fsdp._fsdp_param_group import FSDPParamGroup
    return FSDPParamGroup


class FsdpEvents:
    """Records FSDP2's group events while active (`with FsdpEvents(kinds) as events:`)."""

    def __init__(self, kinds=("unshard", "reshard", "post_backward")) -> None:
        self.kinds = tuple(kinds)
        self.events: List[List[str]] = []
        self._saved = {}

    def __enter__(self):
        cls = _fsdp_param_group_class()
        for kind in self.kinds:
            original = getattr(cls, kind)
            self._saved[kind] = original

            def wrapper(group, *args, __kind=kind, __original=original, **kwargs):
                self.events.append([__kind, group._module_fqn or "",
                                    group._training_state.name])
                return __original(group, *args, **kwargs)

            setattr(cls, kind, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        cls = _fsdp_param_group_class()
        for kind, original in self._saved.items():
            setattr(cls, kind, original)
        self._saved.clear()

    def take(self) -> List[List[str]]:
        """The events so far, clearing the list."""
        out, self.events = self.events, []
        return out
