// fsdp-launch: a torchrun-compatible local launcher (docs/pg_bench.md, "Launchers"): starts
// --nproc-per-node processes of any program with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (and FSDP_STORE_PATH) set. The
// launcher itself is tools/launch/local_launcher.h.
#include <iostream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "tools/launch/local_launcher.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  fsdp::bench::LocalLaunchOptions options;
  try {
    bool help = false;
    options = fsdp::bench::ParseLocalLaunchArgs(args, &help);
    if (help) {
      std::cout << fsdp::bench::LocalLaunchUsage();
      return 0;
    }
  } catch (const fsdp::Error& e) {
    std::cerr << e.message() << "\n\n" << fsdp::bench::LocalLaunchUsage();
    return 2;
  }
  try {
    return fsdp::bench::RunLocalWorld(options);
  } catch (const fsdp::Error& e) {
    std::cerr << "fsdp-launch: " << e.what() << "\n";
    return 1;
  }
}
