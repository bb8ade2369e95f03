// main() of conformance_tests. Invoked as `conformance_tests __worker FLAGS...` by the
// process-launcher tests, the binary is a worker of the toy catalog (testing/toy_catalog.h),
// just as `fsdp-conform __worker` is for the default catalog; otherwise it runs GoogleTest.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "conformance/driver_protocol.h"
#include "conformance/testing/toy_catalog.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == fsdp::conformance::kWorkerCommand) {
    return fsdp::conformance::RunWorker(std::vector<std::string>(argv + 2, argv + argc),
                                        fsdp::conformance::testing::ToyCatalog(), std::cerr);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
