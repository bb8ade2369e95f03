"""Recorders that turn what PyTorch does into the suite's observations:

  CommCounts     collectives by phase, {"forward": {op key: n}, "backward": {...}}, from
                 torch's CommDebugMode (its keys, str(op packet), are the suite's op keys:
                 "c10d._allgather_base_", "c10d._reduce_scatter_base_", ...);
                 CommCounts(track_modules=False) counts without CommDebugMode's per-module
                 tracker (see _NoModuleTracker); CommCounts(with_bytes=True) also sums each
                 collective's payload bytes by phase and op key (_CommBytesMode)
  ReduceOps      the reduce ops of the reduce-scatters and all-reduces issued while active,
                 {op key: {"AVG" | "SUM" | "PREMUL_SUM" | ...: n}}, with CommDebugMode's keys
                 ("c10d._reduce_scatter_base_", "c10d.allreduce_"), by wrapping
                 torch.distributed's reduce_scatter_tensor / reduce_scatter_single /
                 all_reduce for the recorder's lifetime (the outermost call only, when one
                 calls another)
  ModuleCommCounts
                 collectives by module over one CommDebugMode (its comm_module_counts, the
                 module tracker's attribution), keyed by FQN from the root ("" for the root)
                 for the modules asked for, and "Global"
  FsdpEvents     FSDP2's unshard / reshard / post_backward calls as the suite's events
                 [kind, module FQN (root ""), training state], recorded as the seeds' patches
                 record them (test_fully_shard_comm.py's unshard_with_record,
                 reshard_with_record, post_backward_with_record): no-op calls are left out (an
                 unshard finding the group unsharded or its all-gather pending; a reshard in
                 FORWARD of a group that does not reshard after forward), unshard and reshard
                 carry the state as the call begins, post_backward the state it leaves
                 (POST_BACKWARD); by wrapping FSDPParamGroup's methods of those names for the
                 recorder's lifetime

Ownership: a recorder owns the lists it fills; FsdpEvents restores FSDPParamGroup's methods
on exit, ReduceOps torch.distributed's functions. Thread-safety: one recorder per rank process, used from the main (autograd) thread.
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
    """_CommBytesMode, defined on first use (importing torch only then)."""
    global _CommBytesMode
    if _CommBytesMode is not None:
        return _CommBytesMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommBytesMode(TorchDispatchMode):
        """The payload bytes of every c10d collective dispatched while active, by op key
        (str(op packet), CommDebugMode's keys): the full buffer, as the suite counts it
        (docs/observations.md): an all-gather's output (c10d._allgather_base_'s first argument,
        allgather_'s output lists), a reduce-scatter's input (c10d._reduce_scatter_base_'s
        second argument, reduce_scatter_'s input lists), any other collective's tensors
        (allreduce_'s list, broadcast_'s...)."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes: Dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            packet = func._overloadpacket
            key = str(packet)
            if key.startswith("c10d."):
                name = key[len("c10d."):]
                payload = args[1] if "reduce_scatter" in name and len(args) > 1 \
                    else args[0] if args else ()
                self.bytes[key] = self.bytes.get(key, 0) + _nbytes(payload)
            return func(*args, **(kwargs or {}))

    _CommBytesMode = CommBytesMode
    return _CommBytesMode


_CommBytesMode = None


def _nbytes(value) -> int:
    """numel * element size of a tensor, summed over (nested) lists of tensors."""
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if hasattr(value, "numel") and hasattr(value, "element_size"):
        return int(value.numel()) * int(value.element_size())
    return 0


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
                if key in phase:  # the collectives CommDebugMode counts, only
                    phase_bytes[key] = phase_bytes.get(key, 0) + n

    def by_phase(self, *names: str) -> Dict[str, Dict[str, int]]:
        """{name: {op key: n}} for each of `names` ({} for a phase with no collective)."""
        return {name: dict(self.counts.get(name, {})) for name in names}

    def bytes_by_phase(self, *names: str) -> Dict[str, Dict[str, int]]:
        """{name: {op key: payload bytes}} for each of `names` (with_bytes only)."""
        return {name: dict(self.bytes.get(name, {})) for name in names}


def reduce_op_name(op) -> str:
    """c10d's name of a ReduceOp ("SUM" when None: the functions' default); PREMUL_SUM for
    the ops _make_nccl_premul_sum and ReduceOp.PREMUL_SUM(factor) make."""
    import torch.distributed as dist

    if op is None:
        return "SUM"
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return "PREMUL_SUM" if "PREMUL_SUM" in str(op) else str(op)


class ReduceOps:
    """`with ReduceOps() as ops:` records the reduce op of every reduce-scatter and all-reduce
    called through torch.distributed; ops.counts is {op key: {reduce op name: n}}."""

    _FUNCTIONS = {"reduce_scatter_tensor": ("c10d._reduce_scatter_base_", 2),
                  "reduce_scatter_single": ("c10d._reduce_scatter_base_", 2),
                  "all_reduce": ("c10d.allreduce_", 1)}

    def __init__(self) -> None:
        self.counts: Dict[str, Dict[str, int]] = {}
        self._saved = {}
        self._depth = 0

    def __enter__(self):
        import torch.distributed as dist

        for name, (key, op_index) in self._FUNCTIONS.items():
            if not hasattr(dist, name):
                continue
            original = getattr(dist, name)
            self._saved[name] = original

            def wrapper(*args, __key=key, __index=op_index, __original=original, **kwargs):
                if self._depth == 0:
                    op = kwargs.get("op", args[__index] if len(args) > __index else None)
                    ops = self.counts.setdefault(__key, {})
                    op_name = reduce_op_name(op)
                    ops[op_name] = ops.get(op_name, 0) + 1
                self._depth += 1
                try:
                    return __original(*args, **kwargs)
                finally:
                    self._depth -= 1

            setattr(dist, name, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()


class ModuleCommCounts:
    """One CommDebugMode while active (`with ModuleCommCounts() as m:`); by_module(fqns) then
    gives its per-module counts: {"Global" or FQN: {"forward": {op key: n}, "backward": {...}}}.
    The tracker names the root by its class name and every other module "<root>.<fqn>", so the
    first name component is dropped ("" for the root); modules outside `fqns` are left out, and
    so are counts of 0. The tracker credits a backward collective only when it saw the forward
    (its backward hooks are set up in forward), so the mode must span both."""

    def __init__(self) -> None:
        try:  # torch >= 2.5
            from torch.distributed.tensor.debug import CommDebugMode
        except ImportError:  # torch 2.4
            from torch.distributed._tensor.debug import CommDebugMode
        self.mode = CommDebugMode()

    def __enter__(self) -> "ModuleCommCounts":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)

    def by_module(self, fqns) -> Dict[str, Dict[str, Dict[str, int]]]:
        out = {key: {"forward": {}, "backward": {}} for key in ["Global", *fqns]}
        for name, phases in self.mode.comm_module_counts.items():
            key = name if name == "Global" else name.partition(".")[2]
            if key not in out:
                continue
            for phase in ("forward", "backward"):
                for op, n in phases.get(phase, {}).items():
                    if n > 0:
                        out[key][phase][str(op)] = int(n)
        return out


def _fsdp_param_group_class():
    try:  # torch >= 2.6
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # torch 2.4 / 2.5
        from torch.distributed._composable.fsdp._fsdp_param_group import FSDPParamGroup
    return FSDPParamGroup


class FsdpEvents:
    """Records FSDP2's group events while active (`with FsdpEvents(kinds) as events:`), as the
    seeds' patched FSDPParamGroup methods do (see the module comment)."""

    def __init__(self, kinds=("unshard", "reshard", "post_backward")) -> None:
        self.kinds = tuple(kinds)
        self.events: List[List[str]] = []
        self._saved = {}

    def _record(self, kind, group) -> None:
        self.events.append([kind, group._module_fqn or "", group._training_state.name])

    @staticmethod
    def _is_noop(kind, group) -> bool:
        if kind == "unshard":
            # 2.9+ also returns early from a PRE_BACKWARD unshard when unshard_in_backward is off
            return (group._all_gather_result is not None or group.is_unsharded
                    or (not getattr(group, "unshard_in_backward", True)
                        and group._training_state.name == "PRE_BACKWARD"))
        if kind == "reshard":
            return (group._training_state.name == "FORWARD"
                    and not group._reshard_after_forward)
        return False

    def __enter__(self):
        cls = _fsdp_param_group_class()
        for kind in self.kinds:
            original = getattr(cls, kind)
            self._saved[kind] = original

            def wrapper(group, *args, __kind=kind, __original=original, **kwargs):
                record = not self._is_noop(__kind, group)
                if record and __kind != "post_backward":
                    self._record(__kind, group)
                out = __original(group, *args, **kwargs)
                if record and __kind == "post_backward":
                    self._record(__kind, group)
                return out

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
