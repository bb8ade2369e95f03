#include "conformance/cli.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "conformance/driver_protocol.h"
#include "conformance/interrupt.h"
#include "conformance/observations.h"
#include "conformance/offline_case.h"
#include "conformance/ordered_jobs.h"
#include "conformance/report.h"
#include "conformance/runner.h"
#include "conformance/schema_doc.h"
#include "engine/core/error.h"
#include "engine/fsdp/semantics.h"
#include "engine/serialization/atomic_file.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kUsage = R"(usage: fsdp-conform <command> [arguments]

Runs the FSDP conformance scenarios (mirrors of PyTorch's FSDP tests) against an engine.

commands:
  list [PATTERN...] [--json]
      List scenarios (all, or those matching the glob patterns) with their parameters,
      world sizes and backends, then the backends and subjects of this build.
  run PATTERN... [options]
      Run every scenario matching a glob pattern ('*' and '?', e.g. 'fully_shard_comm/*').
      Unfixed parameter axes run every value (each combination is one case).
  schema [PATTERN...] [--markdown]
      Print what each scenario's driver reads (input files) and must report (observations)
      as JSON Schema, or as the Markdown page docs/observations.md.
  expect SCENARIO --dir DIR [--world N] [--param KEY=VALUE]... [--backend NAME]
      Write one case (every axis fixed) into DIR as the runner would: the input files,
      rankR.request.json per rank (their "args" are the driver's flags) and, where the
      scenario can say, the expected observations in DIR/expected/.
  check DIR
      Judge the results a driver wrote into DIR (prepared by expect, or a run directory the
      runner kept): schema validation and the scenario's judge, as run does.
  help
      Print this text.

run options:
  --backend NAME       threaded (default), gloo or nccl; for --subject external the
                       default is gloo
  --world N            world size instead of each scenario's default (scenarios whose
                       range excludes N are skipped)
  --param KEY=VALUE    fix a parameter (repeatable); KEY must belong to a matched scenario
  --semantics NAME     FSDP semantics profile the run is judged by: torch-2.4 (default),
                       torch-2.8 or torch-2.15 (sets the `semantics` parameter of every
                       scenario that declares it)
  --json FILE|-        write the results as JSON to FILE, or to stdout with '-' (the table
                       then goes to stderr)
  --timeout SECONDS    deadline per case (default 300); stragglers are stopped
  --subject NAME       implementation under test: engine (default), a registered subject,
                       or external (with --driver)
  --driver PATH        program run once per rank under the driver protocol
                       (docs/scenarios.md) when --subject external
  --driver-sessions auto|off
                       auto (default): a driver that declares sessions (DRIVER
                       --capabilities) starts one process per rank per world, each serving
                       many cases (DRIVER --serve); off: one process per rank per case
  --max-driver-ranks N skip, saying so, the cases of --subject external whose world would
                       start more than N driver processes at once (default: no limit)
  --determinism WHICH  which cases of the scenarios that train run twice, their observations
                       required to be bit-identical: first (default: the first case of each
                       scenario at each world), all, or none
  --jobs N             cases run at once (default: the machine's cores); only where ranks
                       are threads of this process (the engine, or a registered subject
                       that supports concurrent cases, on the threaded backend): other runs
                       take one case at a time. The table keeps the plan's order
  --no-check-collectives
                       process ranks skip the cross-rank fingerprint check of every
                       collective (on by default: FSDP_CHECK_COLLECTIVES=1 in their
                       environment, so mismatched collectives fail every rank, naming both
                       sides, instead of hanging or computing garbage)

The run table is followed by "semantics: NAME" (the run's profile; without --semantics the
profile-dependent scenarios also run under torch-2.8, which the line names) and ends with the line
"N passed, N failed, N skipped".
Exit status: 0 nothing failed, 1 a case failed, 2 usage or name error, 3 every case was
skipped (nothing judged), 128+N interrupted by signal N (after the partial report).
)";

// A parsed "--name value" / "--name=value" list. Strict: every flag must be known, valued
// flags need a value, single flags appear once.
class FlagParser {
 public:
  FlagParser(std::string command, std::set<std::string> valued, std::set<std::string> repeated,
             std::set<std::string> switches)
      : command_(std::move(command)),
        valued_(std::move(valued)),
        repeated_(std::move(repeated)),
        switches_(std::move(switches)) {}

  void Parse(const std::vector<std::string>& args, size_t first) {
    for (size_t i = first; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.size() < 2 || a[0] != '-' || a == "-") {
        positional_.push_back(a);
        continue;
      }
      std::string name = a;
      std::optional<std::string> value;
      if (const size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
      }
      if (switches_.count(name)) {
        FSDP_CHECK(!value, command_, ": ", name, " takes no value");
        FSDP_CHECK(!seen_.count(name), command_, ": ", name, " given twice");
        seen_.insert(name);
        continue;
      }
      FSDP_CHECK(valued_.count(name) || repeated_.count(name), command_, ": unknown option '", name,
                 "' (see fsdp-conform --help)");
      if (!value) {
        FSDP_CHECK(i + 1 < args.size(), command_, ": ", name, " needs a value");
        value = args[++i];
      }
      if (repeated_.count(name)) {
        multi_[name].push_back(*value);
      } else {
        FSDP_CHECK(!values_.count(name), command_, ": ", name, " given twice");
        values_[name] = *value;
      }
    }
  }

  bool Has(const std::string& name) const { return seen_.count(name) || values_.count(name); }
  std::optional<std::string> Value(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  std::vector<std::string> Values(const std::string& name) const {
    auto it = multi_.find(name);
    return it == multi_.end() ? std::vector<std::string>{} : it->second;
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string command_;
  std::set<std::string> valued_, repeated_, switches_, seen_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> multi_;
  std::vector<std::string> positional_;
};

nlohmann::json ParamJson(const ParamSpec& p) {
  nlohmann::json j = {
      {"name", p.name},
      {"description", p.description},
      {"kind", ParamKindName(p.kind)},
      {"type", ParamTypeName(p.type)},
      {"values", p.values},
      {"default",
       p.kind == ParamKind::kAxis ? nlohmann::json("all") : nlohmann::json(p.default_value())}};
  if (p.domain) j["accepts"] = p.domain->text;
  return j;
}

// The backends of `backends` whose capabilities meet the scenario's requirements.
std::vector<std::string> BackendsFor(const ScenarioInfo& i,
                                     const distributed::BackendRegistry& backends) {
  std::vector<std::string> out;
  for (const auto& name : backends.Names()) {
    if (!i.requirements.UnmetBy(backends.Get(name))) out.push_back(name);
  }
  return out;
}

nlohmann::json ScenarioJson(const Scenario& s, const distributed::BackendRegistry& backends) {
  const ScenarioInfo& i = s.info;
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : i.params) params.push_back(ParamJson(p));
  return {{"name", i.name},
          {"family", i.family()},
          {"description", i.description},
          {"seed_test", i.seed_test},
          {"default_world", i.default_world},
          {"extra_default_runs",
           [&] {
             nlohmann::json runs = nlohmann::json::array();
             for (const TestRun& run : i.extra_default_runs) {
               runs.push_back({{"world", run.world}, {"params", run.params}});
             }
             return runs;
           }()},
          {"min_world", i.min_world},
          {"max_world", i.max_world},
          {"backends", BackendsFor(i, backends)},
          {"requirements",
           {{"in_process", i.requirements.in_process},
            {"devices",
             [&] {
               std::vector<std::string> d;
               for (DeviceType t : i.requirements.devices) {
                 d.push_back(t == DeviceType::kCPU ? "cpu" : "cuda");
               }
               return d;
             }()},
            {"collectives",
             [&] {
               std::vector<std::string> c;
               for (auto op : i.requirements.collectives) {
                 c.push_back(distributed::CollectiveOpName(op));
               }
               return c;
             }()}}},
          {"requires_gpu", i.requirements.requires_gpu()},
          {"params", params},
          {"inputs", InputsJson(i.inputs)},
          {"observations",
           i.observations.empty() ? nlohmann::json(nullptr) : i.observations.ToJsonSchema()}};
}

std::string Join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + i;
  return out;
}

int List(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out) {
  FlagParser flags("list", {}, {}, {"--json"});
  flags.Parse(args, 1);
  std::vector<const Scenario*> scenarios = flags.positional().empty()
                                               ? catalog.scenarios.All()
                                               : catalog.scenarios.Match(flags.positional());
  if (flags.Has("--json")) {
    nlohmann::json doc;
    doc["scenarios"] = nlohmann::json::array();
    for (const Scenario* s : scenarios) doc["scenarios"].push_back(ScenarioJson(*s, catalog.backends));
    doc["backends"] = nlohmann::json::array();
    for (const auto& name : catalog.backends.Names()) {
      const distributed::BackendSpec& b = catalog.backends.Get(name);
      auto why = catalog.backends.Unavailable(name);
      std::vector<std::string> collectives;
      for (auto op : b.capabilities.collectives) {
        collectives.push_back(distributed::CollectiveOpName(op));
      }
      nlohmann::json bj = {{"name", name},
                           {"description", b.description},
                           {"mode", distributed::RankPlacementName(b.capabilities.ranks)},
                           {"device", b.capabilities.device == DeviceType::kCPU ? "cpu" : "cuda"},
                           {"collectives", collectives},
                           {"requires_gpu", b.capabilities.device == DeviceType::kCUDA},
                           {"available", !why.has_value()}};
      if (why) bj["unavailable_reason"] = *why;
      doc["backends"].push_back(bj);
    }
    std::vector<std::string> subjects = catalog.subjects.Names();
    subjects.push_back(kExternalSubject);
    doc["subjects"] = subjects;
    doc["semantics"] = fsdp2::SemanticsNames();
    out << doc.dump(2) << "\n";
    return kExitOk;
  }
  if (scenarios.empty()) out << "no scenarios are registered\n";
  for (const Scenario* s : scenarios) {
    const ScenarioInfo& i = s->info;
    out << i.name << "\n";
    out << "    " << i.description << "\n";
    out << "    seed: " << i.seed_test << "\n";
    out << "    world " << i.default_world;
    for (const TestRun& run : i.extra_default_runs) {
      out << " and " << run.world;
      std::string fixed;
      for (const auto& [k, v] : run.params) fixed += (fixed.empty() ? "" : ",") + k + "=" + v;
      if (!fixed.empty()) out << " (" << fixed << ")";
    }
    out << " (range " << i.min_world << ".." << i.max_world << "), requires "
        << i.requirements.str() << ", backends " << Join(BackendsFor(i, catalog.backends), ",")
        << (i.requirements.requires_gpu() ? ", needs a GPU" : "") << "\n";
    size_t width = 0;
    for (const auto& p : i.params) width = std::max(width, p.name.size());
    for (const auto& p : i.params) {
      out << "    --param " << p.name << std::string(width - p.name.size(), ' ') << "  "
          << ParamKindName(p.kind) << "  " << p.ValuesText();
      if (p.kind == ParamKind::kAxis) out << " (all unless fixed)";
      out << "  " << p.description << "\n";
    }
  }
  out << scenarios.size() << " scenario(s)\n\nbackends:\n";
  for (const auto& name : catalog.backends.Names()) {
    const distributed::BackendSpec& b = catalog.backends.Get(name);
    auto why = catalog.backends.Unavailable(name);
    out << "  " << name << " (" << b.capabilities.str() << "): " << b.description << "; "
        << (why ? "unavailable: " + *why : std::string("available")) << "\n";
  }
  std::vector<std::string> subjects = catalog.subjects.Names();
  subjects.push_back(std::string(kExternalSubject) + " (--driver PATH)");
  out << "subjects: " << Join(subjects, ", ") << "\n";
  out << "semantics: " << Join(fsdp2::SemanticsNames(), ", ") << " (default "
      << fsdp2::SemanticsName(fsdp2::kDefaultSemantics) << ")\n";
  return kExitOk;
}

// Throws InvalidArgument naming `path` and the reason when a file cannot be written there: its
// directory is missing or not writable, or it exists and is a directory or not writable.
void CheckWritablePath(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  std::error_code ec;
  FSDP_CHECK(std::filesystem::is_directory(dir, ec), "cannot write ", path, ": directory ",
             dir.string(), " does not exist");
  FSDP_CHECK(::access(dir.c_str(), W_OK) == 0, "cannot write ", path, ": directory ", dir.string(),
             " is not writable");
  if (std::filesystem::exists(p, ec)) {
    FSDP_CHECK(!std::filesystem::is_directory(p, ec), "cannot write ", path, ": it is a directory");
    FSDP_CHECK(::access(path.c_str(), W_OK) == 0, "cannot write ", path, ": it is not writable");
  }
}

int SchemaCommand(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out) {
  FlagParser flags("schema", {}, {}, {"--markdown"});
  flags.Parse(args, 1);
  const std::vector<const Scenario*> scenarios = flags.positional().empty()
                                                     ? catalog.scenarios.All()
                                                     : catalog.scenarios.Match(flags.positional());
  if (flags.Has("--markdown")) {
    out << ObservationsMarkdown(scenarios);
    return kExitOk;
  }
  nlohmann::json doc = nlohmann::json::array();
  for (const Scenario* s : scenarios) doc.push_back(ScenarioSchemaJson(*s));
  out << doc.dump(2) << "\n";
  return kExitOk;
}

int ExpectCommand(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out) {
  FlagParser flags("expect", {"--dir", "--world", "--backend"}, {"--param"}, {});
  flags.Parse(args, 1);
  FSDP_CHECK(flags.positional().size() == 1, "expect: name exactly one scenario");
  const std::optional<std::string> dir = flags.Value("--dir");
  FSDP_CHECK(dir && !dir->empty(), "expect: --dir DIR is required");
  int world = 0;
  if (auto w = flags.Value("--world")) {
    auto v = ParseInt(*w);
    FSDP_CHECK(v && *v >= 1, "expect: --world expects a positive integer, got '", *w, "'");
    world = static_cast<int>(*v);
  }
  std::map<std::string, std::string> params;
  for (const std::string& kv : flags.Values("--param")) {
    auto [k, v] = ParseParamAssignment(kv);
    FSDP_CHECK(params.count(k) == 0, "expect: --param ", k, " given twice");
    params[k] = v;
  }
  const ResolvedCase c = ResolveCase(catalog, flags.positional().front(), world, params);
  const PreparedCase prepared =
      PrepareCase(c, flags.Value("--backend").value_or(kBackendGloo), *dir);
  out << c.scenario->info.name << " at world " << c.world << " written to " << *dir << "\n";
  for (const std::string& f : prepared.request_files) out << "  " << f << "\n";
  out << (prepared.has_expected
              ? "  expected observations: " + *dir + "/expected/\n"
              : "  no expected observations: this scenario's judge derives them from what the "
                "ranks report\n");
  out << "Run your driver once per rank with the \"args\" of each request file, then: "
         "fsdp-conform check "
      << *dir << "\n";
  return kExitOk;
}

int CheckCommand(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out) {
  FlagParser flags("check", {}, {}, {});
  flags.Parse(args, 1);
  FSDP_CHECK(flags.positional().size() == 1, "check: name exactly one directory");
  const CaseResult result = CheckCase(catalog, flags.positional().front());
  PlannedCase planned;
  planned.scenario = &catalog.scenarios.Get(result.scenario);
  planned.params = result.params;
  planned.world = result.world;
  TableWriter table(out, {planned}, result.backend);
  table.Header();
  table.Row(result);
  out << SummaryLine(CountResults({result})) << "\n";
  return result.status == CaseStatus::kFailed ? kExitFailed : kExitOk;
}

int Run(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out,
        std::ostream& err) {
  FlagParser flags(
      "run",
      {"--backend", "--world", "--json", "--timeout", "--subject", "--driver", "--semantics",
       "--determinism", "--driver-sessions", "--max-driver-ranks", "--jobs"},
      {"--param"}, {"--no-check-collectives"});
  flags.Parse(args, 1);
  RunOptions options;
  options.check_collectives = !flags.Has("--no-check-collectives");
  if (auto d = flags.Value("--determinism")) options.determinism = ParseDeterminismCheck(*d);
  options.patterns = flags.positional();
  FSDP_CHECK(!options.patterns.empty(),
             "run: give at least one scenario pattern, e.g. "
             "'fully_shard_comm/*' or '*' (see fsdp-conform list)");
  options.backend = flags.Value("--backend");
  if (auto w = flags.Value("--world")) {
    auto v = ParseInt(*w);
    FSDP_CHECK(v.has_value() && *v >= 1 && *v <= 4096,
               "run: --world expects an integer in "
               "[1, 4096], got '",
               *w, "'");
    options.world = static_cast<int>(*v);
  }
  if (auto t = flags.Value("--timeout")) {
    auto v = ParseDouble(*t);
    FSDP_CHECK(v.has_value() && *v > 0 && *v <= 86400,
               "run: --timeout expects seconds in "
               "(0, 86400], got '",
               *t, "'");
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(*v * 1000 + 0.5));
    if (options.timeout.count() == 0) options.timeout = std::chrono::milliseconds(1);
  }
  for (const auto& p : flags.Values("--param")) {
    auto [k, v] = ParseParamAssignment(p);
    FSDP_CHECK(!options.params.count(k), "run: --param ", k, " given twice");
    options.params[k] = v;
  }
  if (auto s = flags.Value("--subject")) options.subject = *s;
  options.semantics = flags.Value("--semantics");
  if (auto d = flags.Value("--driver")) options.driver = *d;
  if (auto s = flags.Value("--driver-sessions")) {
    FSDP_CHECK(*s == "auto" || *s == "off", "run: --driver-sessions expects auto or off, got '",
               *s, "'");
    options.driver_sessions = *s == "auto";
  }
  if (auto m = flags.Value("--max-driver-ranks")) {
    auto v = ParseInt(*m);
    FSDP_CHECK(v.has_value() && *v >= 0 && *v <= 4096,
               "run: --max-driver-ranks expects an integer in [0, 4096], got '", *m, "'");
    options.max_driver_ranks = static_cast<int>(*v);
  }
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (auto j = flags.Value("--jobs")) {
    auto v = ParseInt(*j);
    FSDP_CHECK(v.has_value() && *v >= 1 && *v <= 256,
               "run: --jobs expects an integer in [1, 256], got '", *j, "'");
    jobs = static_cast<int>(*v);
  }
  const std::optional<std::string> json_path = flags.Value("--json");
  if (json_path) FSDP_CHECK(!json_path->empty(), "run: --json needs a FILE or '-'");
  // An unwritable report path is a usage error found before any case runs.
  if (json_path && *json_path != "-") CheckWritablePath(*json_path);

  Runner runner(catalog, options);
  std::vector<PlannedCase> plan = runner.Plan();  // name errors surface here

  std::ostream& table = json_path && *json_path == "-" ? err : out;
  TableWriter writer(table, plan, runner.backend());
  writer.Header();
  std::vector<CaseResult> results;
  // SIGINT/SIGTERM: the running case ends (process ranks are stopped), no further case runs,
  // the partial report is written, then the process ends as the signal would have.
  RunInterrupt interrupt;
  std::vector<std::string> not_run;
  RunOrdered<CaseResult>(
      plan.size(), runner.cases_may_run_concurrently() ? jobs : 1,
      [&](size_t i) -> std::optional<CaseResult> {
        if (RunInterrupt::received() != 0) return std::nullopt;
        CaseResult result = runner.RunCase(plan[i]);
        // Only what the report carries stays: a run keeps every result until its end.
        for (nlohmann::json& o : result.observations) o = ReportedObservations(o);
        return result;
      },
      [&](size_t i, std::optional<CaseResult> result) {
        if (!result) {
          not_run.push_back(plan[i].scenario->info.name + " (" + plan[i].params.Label() + ")");
          return;
        }
        results.push_back(std::move(*result));
        writer.Row(results.back());
      });
  // The driver's session ends while the run's signal handling is still in place.
  runner.EndSessions();
  const Tally tally = CountResults(results);
  table << SemanticsLine(runner.semantics(), runner.other_semantics()) << "\n"
        << SummaryLine(tally) << "\n";
  if (RunInterrupt::received() != 0) {
    table << "interrupted by signal " << RunInterrupt::received() << ": " << not_run.size()
          << " case(s) not run\n";
  }
  table.flush();

  if (json_path) {
    nlohmann::json report = ResultsJson(results, runner.semantics());
    if (RunInterrupt::received() != 0) {
      report["interrupted"] = {{"signal", RunInterrupt::received()}, {"not_run", not_run}};
    }
    const std::string doc = report.dump(2) + "\n";
    if (*json_path == "-") {
      out << doc;
      out.flush();
    } else {
      try {
        serialization::WriteFileAtomically(*json_path, doc);
      } catch (const Error& e) {
        err << "fsdp-conform: error: " << e.message() << "\n";
        return kExitFailed;  // the cases ran; their report could not be delivered
      }
    }
  }
  RunInterrupt::EndAsSignalled();
  if (tally.failed > 0) return kExitFailed;
  if (tally.passed == 0 && tally.skipped > 0) {
    err << "fsdp-conform: error: nothing was judged: every selected case was skipped (see the "
           "reasons above)\n";
    return kExitNothingJudged;
  }
  return kExitOk;
}

}  // namespace

std::string CliUsage() { return kUsage; }

int RunCli(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& out,
           std::ostream& err) {
  if (args.empty()) {
    out << kUsage;
    return kExitUsage;
  }
  const std::string& command = args[0];
  if (command == "help" || command == "--help" || command == "-h") {
    out << kUsage;
    return kExitOk;
  }
  for (size_t i = 1; i < args.size() && command != kWorkerCommand; ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      out << kUsage;
      return kExitOk;
    }
  }
  try {
    if (command == "list") return List(args, catalog, out);
    if (command == "run") return Run(args, catalog, out, err);
    if (command == "schema") return SchemaCommand(args, catalog, out);
    if (command == "expect") return ExpectCommand(args, catalog, out);
    if (command == "check") return CheckCommand(args, catalog, out);
    if (command == kWorkerCommand) {
      return RunWorker(std::vector<std::string>(args.begin() + 1, args.end()), catalog, err);
    }
    err << "fsdp-conform: error: unknown command '" << command << "' (commands: list, run, schema, expect, check, help)\n";
    return kExitUsage;
  } catch (const Error& e) {
    err << "fsdp-conform: error: " << e.message() << "\n";
    return kExitUsage;
  }
}

int CliMain(int argc, char** argv, const Catalog& catalog) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return RunCli(args, catalog, std::cout, std::cerr);
}

}  // namespace fsdp::conformance
