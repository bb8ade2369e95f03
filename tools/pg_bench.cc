// pg-bench: an nccl-tests-style collective benchmark over any process-group backend
// (docs/pg_bench.md). The program lives in tools/bench/pg_bench_main.cc.
#include "fakes/rank_thread_memory.h"
#include "tools/bench/pg_bench_main.h"

int main(int argc, char** argv) {
  fsdp::fakes::KeepFreedMemoryInProcess();  // threaded worlds of up to hundreds of ranks
  return fsdp::bench::PgBenchMain(argc, argv);
}
