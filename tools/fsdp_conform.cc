// fsdp-conform: the conformance CLI (docs/cli.md). Everything lives in the conformance
// library (conformance/cli.h) so that tests and third parties can run it over their own
// catalog; this file only supplies the default one.
#include "conformance/catalog.h"
#include "conformance/cli.h"

int main(int argc, char** argv) {
  return fsdp::conformance::CliMain(argc, argv, fsdp::conformance::DefaultCatalog());
}
