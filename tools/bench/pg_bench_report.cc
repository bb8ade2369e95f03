#include "tools/bench/pg_bench_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tools/bench/byte_size.h"

namespace fsdp::bench {

namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string SweepText(const PgBenchOptions& o) {
  std::string s = FormatByteSize(o.min_bytes) + ".." + FormatByteSize(o.max_bytes);
  if (o.min_bytes == o.max_bytes) return FormatByteSize(o.min_bytes);
  if (o.factor > 1) return s + " (x" + std::to_string(o.factor) + ")";
  return s + " (+" + FormatByteSize(o.step_bytes) + ")";
}

std::string CollectiveList(const PgBenchOptions& o) {
  std::string s;
  for (const CollectiveDescriptor* op : o.collectives)
    s += (s.empty() ? "" : ",") + std::string(op->name);
  return s;
}

std::string BytesText(size_t bytes) {
  if (bytes % (size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

double ReadLoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

namespace {
int RanksPerProcess(const PgBenchFacts& facts) {
  return facts.processes > 0 ? std::max(1, facts.world / facts.processes) : 1;
}
}  // namespace

Table PgBenchTable(const std::vector<PgBenchRow>& rows, const CollectiveDescriptor& collective,
                   double memcpy_gbps, double memcpy_all_cores_gbps,
                   int ranks_per_process) {
  Table table({
      {"size", "size", "(B)", 0},
      {"count", "count", "(elements)", 0},
      {"type", "type", "", 0},
      {"redop", "redop", "", 0},
      {"root", "root", "", 0},
      {"time_us", "time", "(us)", 2},
      {"algbw_gbps", "algbw", "(GB/s)", 4},
      {"busbw_gbps", "busbw", "(GB/s)", 4},
      {"wrong", "#wrong", "", 0},
      {"busbw_per_memcpy", "busbw/memcpy", "", 4},
      {"process_busbw_per_memcpy_all_cores", "proc-busbw/memcpyN", "", 4},
  });
  for (const PgBenchRow& r : rows) {
    if (r.collective != &collective) continue;
    table.AddRow({
        r.counts.bytes,
        r.counts.count,
        std::string(NcclTypeName(r.dtype)),
        std::string(r.redop ? RedOpName(*r.redop) : "none"),
        int64_t{r.root},
        r.time_us,
        r.algbw_gbps,
        r.busbw_gbps,
        r.wrong ? TableCell(*r.wrong) : TableCell(),
        memcpy_gbps > 0 ? TableCell(r.busbw_gbps / memcpy_gbps) : TableCell(),
        memcpy_all_cores_gbps > 0
            ? TableCell(r.busbw_gbps * ranks_per_process / memcpy_all_cores_gbps)
            : TableCell(),
    });
  }
  return table;
}

double AverageBusBandwidth(const std::vector<PgBenchRow>& rows,
                           const CollectiveDescriptor& collective) {
  double sum = 0;
  int n = 0;
  for (const PgBenchRow& r : rows) {
    if (r.collective != &collective) continue;
    sum += r.busbw_gbps;
    ++n;
  }
  return n > 0 ? sum / n : 0;
}

int64_t TotalWrong(const std::vector<PgBenchRow>& rows) {
  int64_t total = 0;
  for (const PgBenchRow& r : rows) total += r.wrong.value_or(0);
  return total;
}

std::string PgBenchText(const PgBenchFacts& facts, const PgBenchOptions& options,
                        const PgBenchSweep& sweep) {
  std::ostringstream os;
  os << "# pg-bench: backend " << facts.backend << ", world " << facts.world << " ("
     << facts.processes << (facts.processes == 1 ? " process" : " processes") << "), host "
     << facts.hostname << " with " << facts.nproc << " hardware threads";
  if (facts.load_average >= 0) os << ", load average " << Fixed(facts.load_average, 2);
  os << "\n";
  os << "# collectives " << CollectiveList(options) << ", sizes " << SweepText(options)
     << ", datatype " << NcclTypeName(options.dtype) << ", redop " << RedOpName(options.redop)
     << ", iters " << options.iters << ", warm-up " << options.warmup_iters << ", check "
     << (options.check ? 1 : 0) << "\n";
  os << "# memcpy bandwidth: " << Fixed(facts.memcpy.gbps, 2) << " GB/s (std::memcpy of "
     << BytesText(facts.memcpy.bytes) << ", best of " << facts.memcpy.repeats << ", one thread)";
  if (facts.memcpy_all_cores.threads > 0 && facts.memcpy_all_cores.gbps > 0) {
    os << "; " << Fixed(facts.memcpy_all_cores.gbps, 2) << " GB/s with "
       << facts.memcpy_all_cores.threads << " threads (memcpyN)";
  }
  os << "\n";
  for (const CollectiveDescriptor* op : options.collectives) {
    os << "#\n# " << op->name << "\n";
    os << PgBenchTable(sweep.rows, *op, facts.memcpy.gbps, facts.memcpy_all_cores.gbps,
                       RanksPerProcess(facts))
              .ToText();
    os << "# Avg bus bandwidth    : " << Fixed(AverageBusBandwidth(sweep.rows, *op), 3)
       << " GB/s\n";
  }
  for (const auto& s : sweep.skipped) os << "# " << s << "\n";
  if (options.check) {
    const int64_t wrong = TotalWrong(sweep.rows);
    os << "# Out of bounds values : " << wrong << (wrong == 0 ? " OK" : " FAILED") << "\n";
  }
  return os.str();
}

nlohmann::json PgBenchJson(const PgBenchFacts& facts, const PgBenchOptions& options,
                           const PgBenchSweep& sweep) {
  nlohmann::json j;
  j["tool"] = "pg-bench";
  j["backend"] = facts.backend;
  j["world"] = facts.world;
  j["processes"] = facts.processes;
  j["nproc"] = facts.nproc;
  j["hostname"] = facts.hostname;
  j["load_average"] =
      facts.load_average >= 0 ? nlohmann::json(facts.load_average) : nlohmann::json();
  j["memcpy"] = {{"gbps", facts.memcpy.gbps},
                 {"bytes", facts.memcpy.bytes},
                 {"repeats", facts.memcpy.repeats},
                 {"best_seconds", facts.memcpy.best_seconds}};
  j["memcpy_all_cores"] = {{"gbps", facts.memcpy_all_cores.gbps},
                           {"bytes", facts.memcpy_all_cores.bytes},
                           {"repeats", facts.memcpy_all_cores.repeats},
                           {"threads", facts.memcpy_all_cores.threads},
                           {"best_seconds", facts.memcpy_all_cores.best_seconds}};
  nlohmann::json collectives = nlohmann::json::array();
  for (const CollectiveDescriptor* op : options.collectives) collectives.push_back(op->name);
  j["options"] = {{"min_bytes", options.min_bytes},
                  {"max_bytes", options.max_bytes},
                  {"step_factor", options.factor},
                  {"step_bytes", options.step_bytes},
                  {"iters", options.iters},
                  {"warmup_iters", options.warmup_iters},
                  {"check", options.check},
                  {"datatype", NcclTypeName(options.dtype)},
                  {"redop", RedOpName(options.redop)},
                  {"collectives", collectives}};
  nlohmann::json results = nlohmann::json::array();
  for (const CollectiveDescriptor* op : options.collectives) {
    results.push_back({{"collective", op->name},
                       {"avg_busbw_gbps", AverageBusBandwidth(sweep.rows, *op)},
                       {"rows", PgBenchTable(sweep.rows, *op, facts.memcpy.gbps,
                                             facts.memcpy_all_cores.gbps, RanksPerProcess(facts))
                                    .ToJson()}});
  }
  j["results"] = results;
  j["skipped"] = sweep.skipped;
  if (options.check) {
    j["wrong"] = TotalWrong(sweep.rows);
  } else {
    j["wrong"] = nullptr;
  }
  return j;
}

}  // namespace fsdp::bench
