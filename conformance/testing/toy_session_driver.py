"""Test-only: a torch-free driver for toy/sum built on the Python driver kit
(python/fsdp_conform_driver), used by conformance/driver_session_test.cc to exercise driver
sessions (--capabilities, --serve) end to end. Each rank reports toy/sum's analytic answer.

Environment (set by the test's wrapper script):
  TOY_DRIVER_PIDS   a directory: every case appends "PID" to rankR.pids there (how the test
                    counts the processes that served the cases)
  TOY_DRIVER_FAULT  "exit:R:CODE" rank R exits with CODE instead of answering,
                    "hang:R" rank R sleeps instead of answering, or "teardown_hang:R" rank R's
                    teardown after its (good) answer sleeps, which the kit gives up after 0.5 s
                    (Driver.teardown_limit_s); once per run (marker file
                    TOY_DRIVER_PIDS/fault.done)
  TOY_DRIVER_NO_SESSIONS  set: answer --capabilities as a one-shot driver would (exit 2)
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python"))

from fsdp_conform_driver import Driver  # noqa: E402


_TEARDOWN_HANGS = []  # set by the case whose teardown is to hang


def _fault(rank: int) -> None:
    spec = os.environ.get("TOY_DRIVER_FAULT", "")
    if not spec:
        return
    kind, fault_rank, *rest = spec.split(":")
    marker = os.path.join(os.environ["TOY_DRIVER_PIDS"], "fault.done")
    if int(fault_rank) != rank or os.path.exists(marker):
        return
    with open(marker, "w", encoding="utf-8"):
        pass
    if kind == "teardown_hang":
        _TEARDOWN_HANGS.append(True)
    if kind == "exit":
        sys.stdout.flush()
        os._exit(int(rest[0]))
    if kind == "hang":
        time.sleep(3600)


def toy_sum(request):
    with open(os.path.join(os.environ["TOY_DRIVER_PIDS"], f"rank{request.rank}.pids"), "a",
              encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    _fault(request.rank)
    factor = 2 if request.param("mode") == "doubled" else 1
    scale = request.int_param("scale")
    value = (request.rank + 1) * scale * factor
    world = request.world
    return {"value": value, "total": scale * factor * world * (world + 1) // 2,
            "comm_counts": {"forward": {"allreduce_": 1 if world > 1 else 0}, "backward": {}},
            "tensors": {"v": {"shape": [1], "dtype": "float64", "data": [value]}}}, None


if __name__ == "__main__":
    if os.environ.get("TOY_DRIVER_NO_SESSIONS") and sys.argv[1:] == ["--capabilities"]:
        sys.exit(2)
    def teardown():
        if _TEARDOWN_HANGS:
            _TEARDOWN_HANGS.clear()
            time.sleep(3600)

    driver = Driver("toy session driver", {"toy/sum": toy_sum}, teardown=teardown)
    driver.teardown_limit_s = 0.5
    sys.exit(driver.main())
