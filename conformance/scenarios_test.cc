// The conformance suite under ctest: every registered scenario, on our engine, on the threaded
// backend, at its default world with its default parameters (all axis values).
#include "conformance/catalog.h"
#include "conformance/gtest_suite.h"

FSDP_CONFORMANCE_TEST_SUITE(EngineConformance, ::fsdp::conformance::DefaultCatalog(),
                            ::fsdp::conformance::kEngineSubject);
