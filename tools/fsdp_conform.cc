// fsdp-conform: the conformance CLI (docs/cli.md). Everything lives in the conformance
// library (conformance/cli.h) so that tests and third parties can run it over their own
// catalog; this file only supplies the default one.
#include "conformance/catalog.h"
#include "conformance/cli.h"
#include "fakes/rank_thread_memory.h"

int main(int argc, char** argv) {
  fsdp::fakes::KeepFreedMemoryInProcess();  // threaded worlds of up to hundreds of ranks
  return fsdp::conformance::CliMain(argc, argv, fsdp::conformance::DefaultCatalog());
}
