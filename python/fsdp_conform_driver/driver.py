"""The entry point of a driver built on the kit: a table {scenario name: function(request)}
whose function returns (observations, tensors) or raises ScenarioSkipped / ScenarioError.
Driver.main() parses the flags, runs the function and writes the result: ok (exit 0),
skipped (exit 0; every scenario absent from the table is skipped naming the driver), error
(exit 1; exceptions become Internal, or the code of a ScenarioError), or exit 2 without a
result when the flags do not follow the protocol.

Driver sessions (docs/drivers.md, "Persistent mode"; conformance/driver_session.h): a kit
driver declares them. `--capabilities` prints {"protocol": 2, "session": true}; `--serve`
reads cases from stdin, one line each (the JSON array of a one-shot rank's flags), runs each
as main() would (setup, the scenario, teardown so that the next case starts from a fresh
rendezvous, and the result file) and exits 0 at the end of file, or 2 on a line that is not a
protocol-2 request. In a session the result of a case that went well is written after its
teardown, so the runner hands out the next case only to ranks that are clean again; a failed
case's result is written first (the runner ends the session after it anyway). A teardown
still running after teardown_limit_s (PyTorch's destroy_process_group and the garbage
collection of a case's Gloo groups can hang) makes the rank write its result with
"end_session" (the runner stops this session once it has every rank's result and starts a
fresh one for the next case; this case keeps its verdict).

Hang diagnostics: while a case runs, faulthandler is armed to dump every thread's Python stack
to the process's stderr (sys.__stderr__: the rank's log, which the runner quotes when a case
fails) shortly before the case's deadline (--timeout-s less stack_dump_margin_s), and while
teardown() runs, after teardown_dump_s; a teardown given up at teardown_limit_s dumps them too.

Ownership: Driver owns its table. Thread-safety: main() runs on the process's main thread.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import sys
import threading
import traceback
from typing import Callable, Dict, Optional, Tuple

from fsdp_conform_driver import protocol, results


class ScenarioSkipped(Exception):
    """The driver cannot run this case (the reason goes to the table as SKIP)."""


class ScenarioError(Exception):
    """The case failed with one of the protocol's error codes (results.ERROR_CODES)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


ScenarioFn = Callable[[protocol.Request], Tuple[dict, Optional[dict]]]


# What `--capabilities` answers: protocol 2 with driver sessions.
CAPABILITIES = {"protocol": protocol.PROTOCOL_VERSION, "session": True}


class Driver:
    """`setup(request)` runs before each implemented case (e.g. rendezvous.init), `teardown()`
    after it, whatever its outcome (e.g. rendezvous.shutdown); a failing teardown is printed
    to the log and does not change the case's result."""

    # Seconds before the case's deadline at which a still running case dumps its stacks.
    stack_dump_margin_s = 10.0
    # Seconds after which a still running teardown() dumps its stacks (it takes well under 1 s).
    teardown_dump_s = 20.0
    # Seconds a session's teardown() may take before the rank writes its result asking to end
    # the session (a teardown that never returns would leave the rank deaf); if the
    # stuck teardown holds the GIL, faulthandler ends the process teardown_exit_margin_s later
    # (the case then fails, naming the rank's exit, with the stacks in its log).
    teardown_limit_s = 30.0
    teardown_exit_margin_s = 5.0
    # Cases one session process serves before it asks the runner for a fresh one (None: no
    # limit); a driver whose cases leave resources behind on purpose bounds them with it.
    max_cases_per_process: Optional[int] = None

    def __init__(self, name: str, scenarios: Dict[str, ScenarioFn],
                 setup: Optional[Callable[[protocol.Request], None]] = None,
                 teardown: Optional[Callable[[], None]] = None) -> None:
        self.name = name
        self.scenarios = dict(scenarios)
        self.setup = setup
        self.teardown = teardown

    def run(self, request: protocol.Request, in_session: bool = False,
            end_session: Optional[str] = None) -> int:
        """Runs one case and writes its result; `end_session` (why) asks the runner to end the
        driver session after it."""
        fn = self.scenarios.get(request.scenario)
        if fn is None:
            results.write_skipped(request, f"{self.name} does not implement {request.scenario}",
                                  end_session)
            return 0
        timeout = request.timeout_s
        faulthandler.dump_traceback_later(
            timeout - self.stack_dump_margin_s if timeout > 2 * self.stack_dump_margin_s
            else timeout / 2, file=sys.__stderr__)
        code, write_result = self._run(fn, request)

        def write(reason=None):
            write_result(end_session=reason or end_session)

        if self.teardown is None:
            faulthandler.cancel_dump_traceback_later()
            write()
        elif in_session and code == 0:
            # In a session the result of a case that went well is written once the rank is
            # clean again, so that the next case never meets a rank still tearing down; a
            # teardown past teardown_limit_s asks to end the session (see _GuardedTeardown).
            _GuardedTeardown(write, self.teardown_limit_s).run(
                lambda: self._teardown(self.teardown_limit_s + self.teardown_exit_margin_s,
                                       exit_after=True))
        else:
            # A failed case ends the session anyway (and a one-shot rank exits after it): the
            # runner gets the result at once.
            write()
            self._teardown(self.teardown_dump_s)
        return code

    def _teardown(self, dump_after_s: float, exit_after: bool = False) -> None:
        """teardown(), with every thread's stack dumped after `dump_after_s` (and the process
        ended there with `exit_after`: faulthandler needs no GIL)."""
        faulthandler.dump_traceback_later(dump_after_s, file=sys.__stderr__, exit=exit_after)
        try:
            self.teardown()
        except Exception:  # noqa: BLE001 - the case's result stands
            traceback.print_exc()
        faulthandler.cancel_dump_traceback_later()

    def _run(self, fn: ScenarioFn, request: protocol.Request):
        """Runs the case; returns (exit code, the results writer of its outcome, to be called
        with the optional end_session)."""
        try:
            if self.setup is not None:
                self.setup(request)
            observations, tensors = fn(request)
        except ScenarioSkipped as skipped:
            return 0, functools.partial(results.write_skipped, request, f"{self.name}: {skipped}")
        except ScenarioError as error:
            return 1, functools.partial(results.write_error, request, error.code, str(error))
        except Exception as error:  # noqa: BLE001 - every failure is reported to the runner
            traceback.print_exc()
            return 1, functools.partial(results.write_error, request, "Internal",
                                        f"{type(error).__name__}: {error}")
        return 0, functools.partial(results.write_ok, request, observations, tensors)

    def serve(self, lines) -> int:
        """Session mode: runs the case of every line of `lines` (a text stream) until its end;
        from the max_cases_per_process-th case on, each result asks to end the session."""
        served = 0
        for line in iter(lines.readline, ""):
            if not line.strip():
                continue
            try:
                args = json.loads(line)
                if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                    raise protocol.UsageError("a case line must be a JSON array of strings")
                request = protocol.parse_args(args)
            except (protocol.UsageError, ValueError) as error:
                print(f"{self.name}: error: --serve: {error}", file=sys.stderr, flush=True)
                return 2
            print(f"{self.name}: case {request.scenario} rank {request.rank}/{request.world} "
                  f"{' '.join(f'{k}={v}' for k, v in sorted(request.params.items()))}",
                  flush=True)
            served += 1
            last = self.max_cases_per_process is not None and served >= self.max_cases_per_process
            self.run(request, in_session=True,
                     end_session=(f"this process served {served} cases (max_cases_per_process)"
                                  if last else None))
            sys.stdout.flush()
            sys.stderr.flush()
            # After a case asking to end the session the runner closes stdin once it has every
            # rank's result (exiting here could end the session before a peer's result).
        return 0

    def main(self, argv=None) -> int:
        args = sys.argv[1:] if argv is None else list(argv)
        if args == ["--capabilities"]:
            print(json.dumps(CAPABILITIES), flush=True)
            return 0
        if args == ["--serve"]:
            return self.serve(sys.stdin)
        try:
            request = protocol.parse_args(args)
        except (protocol.UsageError, ValueError) as error:
            print(f"{self.name}: error: {error}", file=sys.stderr)
            return 2
        return self.run(request)


class _GuardedTeardown:
    """Runs a session case's teardown, then writes its result; if the teardown is still running
    after `limit_s`, a timer thread writes the result instead, asking the runner to end the
    session (its "end_session"): the runner then stops this process with the session (the
    stuck teardown holds the main thread). Exactly one of the two writes the result.

    Ownership: holds the result writer. Thread-safety: the lock orders the main thread and the
    timer thread."""

    def __init__(self, write, limit_s: float) -> None:
        self._write = write
        self._limit_s = limit_s
        self._lock = threading.Lock()
        self._written = False

    def run(self, teardown) -> None:
        timer = threading.Timer(self._limit_s, self._give_up)
        timer.daemon = True
        timer.start()
        try:
            teardown()
        finally:
            timer.cancel()
            with self._lock:
                if not self._written:
                    self._written = True
                    self._write()

    def _give_up(self) -> None:
        with self._lock:
            if self._written:
                return
            self._written = True
            reason = (f"the rank's teardown did not finish within {self._limit_s:g} s; its stacks "
                      f"are in the rank's log")
            print(f"driver: {reason}; asking the runner to end the session", file=sys.__stderr__,
                  flush=True)
            faulthandler.dump_traceback(file=sys.__stderr__)
            self._write(reason)
