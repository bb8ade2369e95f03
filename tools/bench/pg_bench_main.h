// pg-bench's program: parses the flags, picks the backend, runs the sweep on every rank and
// prints the report on rank 0 (docs/pg_bench.md).
//
//   threaded  --world N ranks as threads of this process (fakes::RunRanks).
//   gloo      one process per rank. Under a launcher (fsdp-launch, torchrun, mpirun, srun:
//             the variables engine/distributed/launch.h reads) this process is one rank; without
//             one, pg-bench starts --world copies of itself through LocalLauncher and
//             returns their combined exit status.
//   nccl      CreateLaunchedRank is the one place where a launched rank's group is made;
//             NCCL plugs in there.
//
// Exit status: 0; 1 on a failed run or any wrong element with -c 1; 2 on a usage error.
// Thread-safety: a program entry point; call once.
#pragma once

namespace fsdp::bench {

int PgBenchMain(int argc, char** argv);

}  // namespace fsdp::bench
