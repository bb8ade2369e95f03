// The `fsdp-conform` command line (docs/cli.md is its contract):
//
//   fsdp-conform list [PATTERN...] [--json]
//   fsdp-conform run PATTERN... [--backend NAME] [--world N] [--param KEY=VALUE]...
//                    [--semantics NAME] [--json FILE|-] [--timeout SECONDS] [--subject NAME]
//                    [--driver PATH]
//   fsdp-conform help | --help | -h
//   fsdp-conform __worker FLAGS...      (hidden: one rank of a process backend)
//
// Exit status: 0 when nothing failed (skips are fine), 1 when a case failed, 2 on a usage or
// name error (nothing ran).
//
// The library form lets tests and third parties run the CLI over their own Catalog.
// Thread-safety: one call at a time per catalog.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "conformance/catalog.h"

namespace fsdp::conformance {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
// `run`: cases were selected and every one was skipped, so nothing was judged.
inline constexpr int kExitNothingJudged = 3;

// `args` excludes the program name. Output goes to `out` (tables, JSON to "-"), diagnostics
// and usage errors to `err`.
int RunCli(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out,
           std::ostream& err);

// main() of fsdp-conform: RunCli over argv with std::cout / std::cerr.
int CliMain(int argc, char** argv, const Catalog& catalog);

// The usage text.
std::string CliUsage();

}  // namespace fsdp::conformance
