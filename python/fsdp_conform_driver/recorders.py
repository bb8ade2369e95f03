"""Recorders that turn what PyTorch does into the suite's observations:

  CommCounts     collectives by phase, {"forward": {op key: n}, "backward": {...}}, from
                 torch's CommDebugMode (its keys, str(op packet), are the suite's op keys:
                 "c10d._allgather_base_", "c10d._reduce_scatter_base_", ...);
                 CommCounts(track_modules=False) counts without CommDebugMode's per-module
                 tracker (see _NoModuleTracker)
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


class CommCounts:
    """Counts the collectives of named phases: `with counts.phase("forward"): ...`."""

    def __init__(self, track_modules: bool = True) -> None:
        self.counts: Dict[str, Dict[str, int]] = {}
        self.track_modules = track_modules

    @contextlib.contextmanager
    def phase(self, name: str):
        try:  # torch >= 2.5
            from torch.distributed.tensor.debug import CommDebugMode
        except ImportError:  # torch 2.4
            from torch.distributed._tensor.debug import CommDebugMode

        mode = CommDebugMode()
        if not self.track_modules and hasattr(mode, "advanced_module_tracker"):
            mode.advanced_module_tracker = _NoModuleTracker()
        with mode:
            yield
        phase = self.counts.setdefault(name, {})
        for op, n in mode.get_comm_counts().items():
            key = str(op)
            phase[key] = phase.get(key, 0) + int(n)

    def by_phase(self, *names: str) -> Dict[str, Dict[str, int]]:
        """{name: {op key: n}} for each of `names` ({} for a phase with no collective)."""
        return {name: dict(self.counts.get(name, {})) for name in names}


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
