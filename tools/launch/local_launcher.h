// LocalLauncher: starts a world's local ranks as child processes the way torchrun does, for
// `fsdp-launch` and for tools that re-execute themselves (pg-bench --backend gloo).
//
// Each child gets the variables engine/distributed/launch.h reads: RANK (node_rank * nproc + local),
// WORLD_SIZE (nnodes * nproc), LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node rank),
// MASTER_ADDR, MASTER_PORT, and FSDP_STORE_PATH when rendezvous goes through a file store.
// Rendezvous: --store-path DIR is passed on as FSDP_STORE_PATH; --master-port P (with
// --master-addr, default 127.0.0.1) is passed on as is; with neither (one node only) the
// launcher makes a fresh temporary store directory, removed afterwards, and also names a free
// local port in MASTER_ADDR/MASTER_PORT for programs that rendezvous over TCP themselves
// (launch.h prefers FSDP_STORE_PATH when both are set).
//
// Spawning, waiting, teardown and signal forwarding are distributed::ProcessLauncher's
// (engine/distributed/launch/process_launcher.h); this file keeps fsdp-launch's options, the
// torchrun variables, the rendezvous and the messages. Children run in their own process
// groups, so that a rank's own children die with it. Their
// stdout and stderr pass through, each line prefixed with "[rank R] " unless
// prefix_output is false (then they inherit the launcher's descriptors). When a child exits
// non-zero or by a signal, the launcher says which rank failed and how, sends SIGTERM to the
// other ranks, SIGKILL after the grace period, and returns the failed rank's exit status
// (128 + signal number for a signal). A run past `timeout` is stopped the same way and returns
// 124. SIGINT/SIGTERM received by the launcher are forwarded to every rank; SIGPIPE is
// ignored while it runs (output to a closed reader is dropped, the ranks keep running).
//
// Ownership: value types and a function; RunLocalWorld owns its children for the call.
// Thread-safety: RunLocalWorld installs process-wide SIGINT/SIGTERM/SIGPIPE dispositions for
// its duration; call it from one thread at a time.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::bench {

struct LocalLaunchOptions {
  int nproc_per_node = 1;   // Default: 1
  int nnodes = 1;           // Default: 1
  int node_rank = 0;        // Default: 0
  std::string master_addr;  // Default: "" (127.0.0.1)
  int master_port = 0;      // Default: 0 (none: rendezvous through a temporary store directory)
  std::string store_path;   // Default: "" (none)
  // Deadline of the whole run; zero means none. Default: 0.
  std::chrono::milliseconds timeout{0};
  // Time between SIGTERM and SIGKILL when stopping ranks. Default: 5 s.
  std::chrono::milliseconds grace{5000};
  // Prefix each output line of a child with "[rank R] ". Default: true.
  bool prefix_output = true;
  // Sets FSDP_CHECK_COLLECTIVES=1 for the ranks (every collective's fingerprint
  // is checked across ranks first). Default: false.
  bool check_collectives = false;
  // The name the launcher's own messages start with. Default: "fsdp-launch".
  std::string name = "fsdp-launch";
  // The program (looked up in PATH) and its arguments.
  std::vector<std::string> command;
};

// fsdp-launch's usage text.
std::string LocalLaunchUsage();

// Parses fsdp-launch's arguments (without the program name): flags, then `--` (optional) and
// the command. Flags take "--flag VALUE" or "--flag=VALUE" and torchrun's underscore spellings
// (--nproc_per_node). Throws InvalidArgument naming the flag on a bad or unknown flag, a
// missing value, an inconsistent layout, or a missing command. `*help` is set (and nothing
// else checked) on -h/--help.
LocalLaunchOptions ParseLocalLaunchArgs(const std::vector<std::string>& args, bool* help = nullptr);

// The launch variables of local rank `local_rank` (name, value), given the resolved
// rendezvous (`store_path` may be empty; `master_port` must be set).
std::vector<std::pair<std::string, std::string>> ChildLaunchVariables(
    const LocalLaunchOptions& options, int local_rank, const std::string& master_addr,
    int master_port, const std::string& store_path);

// Where the launcher writes: children's (prefixed) output and its own messages.
struct LaunchIo {
  int out_fd = 1;  // children's stdout. Default: 1
  int err_fd = 2;  // children's stderr and the launcher's messages. Default: 2
};

// Runs the local ranks to completion; returns 0 when every rank exited 0, otherwise the exit
// status described in the file comment. Throws InvalidArgument for invalid options and
// Unavailable when the temporary store cannot be made.
int RunLocalWorld(const LocalLaunchOptions& options, const LaunchIo& io = {});

}  // namespace fsdp::bench
