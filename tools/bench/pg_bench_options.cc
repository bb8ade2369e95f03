#include "tools/bench/pg_bench_options.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/distributed/backend_registry.h"
#include "fakes/threaded_backend.h"
#include "tools/bench/byte_size.h"

namespace fsdp::bench {

namespace {

int64_t ParseInteger(const std::string& flag, const std::string& value, int64_t min_value,
                     int64_t max_value) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  FSDP_CHECK(errno == 0 && !value.empty() && *end == '\0' && v >= min_value && v <= max_value,
             "pg-bench: ", flag, ": '", value, "' is not an integer in [", min_value, ", ",
             max_value, "]");
  return v;
}

// Long spellings and their short flag.
struct FlagName {
  const char* long_name;
  char short_name;
};
constexpr FlagName kFlags[] = {
    {"--minbytes", 'b'},   {"--maxbytes", 'e'},     {"--stepfactor", 'f'}, {"--stepbytes", 'i'},
    {"--iters", 'n'},      {"--warmup_iters", 'w'}, {"--check", 'c'},      {"--datatype", 'd'},
    {"--collective", 'o'}, {"--redop", 'r'},
};

// The -o lines of the usage: the registered collectives, wrapped at 92 columns.
std::string CollectiveOptionUsage() {
  const std::string indent(27, ' ');
  std::string out = "  -o, --collective OP      ";
  size_t column = out.size();
  const std::string words = CollectiveNames(", ") + ", or all";
  size_t start = 0;
  while (start < words.size()) {
    size_t end = words.find(' ', start);
    if (end == std::string::npos) end = words.size();
    const std::string word = words.substr(start, end - start);
    if (column > indent.size() && column + 1 + word.size() > 92) {
      out += "\n" + indent;
      column = indent.size();
    } else if (column > indent.size()) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    start = end + 1;
  }
  return out + "\n" + indent + "(default all)\n";
}

}  // namespace

std::string PgBenchUsage() {
  return R"(usage: pg-bench [options]

Collective bandwidth benchmark in the style of nccl-tests, over any process-group backend.

  -b, --minbytes SIZE      smallest size (K/M/G suffixes; default 32M)
  -e, --maxbytes SIZE      largest size (default 32M)
  -f, --stepfactor F       multiply the size by F each step (default 1: add -i instead)
  -i, --stepbytes SIZE     add SIZE each step when F <= 1 (default 1M)
  -n, --iters N            timed iterations per size (default 20)
  -w, --warmup_iters N     untimed iterations before them (default 5)
  -c, --check 0|1          verify results on exact check data; exit 1 on any wrong element
                           (default 1)
  -d, --datatype T         float, double, half, bfloat16, int64 (or float32, fp16, bf16, ...;
                           default float)
)" + CollectiveOptionUsage() + R"(  -r, --redop OP           sum, avg, min, max (default sum)
  --backend B              threaded (ranks as threads), gloo (processes over TCP), nccl
                           (default threaded)
  --world N                ranks: threads for threaded; for gloo, the processes pg-bench
                           starts itself when no launcher (fsdp-launch, torchrun, mpirun,
                           srun) set the launch variables (default 2)
  --json PATH|-            also write the results as JSON (to stdout with '-'; the table then
                           goes to stderr)
  -h, --help               this text

Columns: size (B, the whole gathered/input array), count (elements), type, redop, root,
time (us per iteration, mean over iterations, max over ranks), algbw = size/time, busbw
(nccl-tests' bus bandwidth), #wrong, busbw/memcpy (busbw over this host's one-thread memcpy
bandwidth), proc-busbw/memcpyN (busbw times the ranks per process, over the memcpy bandwidth
of one thread per hardware thread: the share of the host's copy bandwidth a process reaches).
)";
}

PgBenchOptions ParsePgBenchArgs(const std::vector<std::string>& args, bool* help) {
  PgBenchOptions o;
  if (help) *help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      if (help) *help = true;
      return o;
    }
    FSDP_CHECK(arg.size() >= 2 && arg[0] == '-', "pg-bench: unexpected argument '", arg,
               "' (see pg-bench --help)");
    // Normalize to a key: a short letter, or a long name without its value.
    std::string key;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      std::string name = arg;
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
      std::string canonical = "--";  // --warmup-iters and --warmup_iters are the same flag
      for (size_t k = 2; k < name.size(); ++k) canonical += name[k] == '-' ? '_' : name[k];
      for (const auto& f : kFlags) {
        if (canonical == f.long_name) key = std::string(1, f.short_name);
      }
      if (canonical == "--backend" || canonical == "--world" || canonical == "--json") {
        key = canonical.substr(2);
      }
    } else {
      key = arg.substr(1, 1);
      if (arg.size() > 2) inline_value = arg.substr(2);  // -b1K
    }
    const std::string flag = arg.rfind("--", 0) == 0 ? arg.substr(0, arg.find('=')) : "-" + key;
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      FSDP_CHECK(i + 1 < args.size(), "pg-bench: ", flag, " needs a value");
      return args[++i];
    };
    if (key == "b") {
      o.min_bytes = ParseByteSize(value(), flag);
    } else if (key == "e") {
      o.max_bytes = ParseByteSize(value(), flag);
    } else if (key == "f") {
      o.factor = ParseInteger(flag, value(), 1, int64_t{1} << 30);
    } else if (key == "i") {
      o.step_bytes = ParseByteSize(value(), flag);
    } else if (key == "n") {
      o.iters = static_cast<int>(ParseInteger(flag, value(), 1, INT_MAX));
    } else if (key == "w") {
      o.warmup_iters = static_cast<int>(ParseInteger(flag, value(), 0, INT_MAX));
    } else if (key == "c") {
      o.check = ParseInteger(flag, value(), 0, 1) == 1;
    } else if (key == "d") {
      o.dtype = ParseBenchDType(value());
    } else if (key == "o") {
      o.collectives = ParseCollectives(value());
    } else if (key == "r") {
      o.redop = ParseRedOp(value());
    } else if (key == "backend") {
      o.backend = value();
      const distributed::BackendRegistry backends = fakes::DefaultBackends();
      if (backends.Find(o.backend) == nullptr) {
        std::string names;
        for (const auto& n : backends.Names()) names += (names.empty() ? "" : ", ") + n;
        FSDP_THROW(ErrorCode::kInvalidArgument, "pg-bench: --backend: unknown backend '",
                   o.backend, "' (choose one of: ", names, ")");
      }
    } else if (key == "world") {
      o.world = static_cast<int>(ParseInteger(flag, value(), 1, 65536));
    } else if (key == "json") {
      o.json_path = value();
      FSDP_CHECK(!o.json_path.empty(), "pg-bench: --json needs a path or '-'");
    } else {
      FSDP_THROW(ErrorCode::kInvalidArgument, "pg-bench: unknown flag '", arg,
                 "' (see pg-bench --help)");
    }
  }
  FSDP_CHECK(o.min_bytes <= o.max_bytes, "pg-bench: -b ", FormatByteSize(o.min_bytes),
             " is larger than -e ", FormatByteSize(o.max_bytes));
  FSDP_CHECK(o.factor > 1 || o.step_bytes > 0 || o.min_bytes == o.max_bytes,
             "pg-bench: -i must be > 0 when -f is 1 and -b differs from -e");
  for (const CollectiveDescriptor* op : o.collectives) {
    FSDP_CHECK(!op->reduces || distributed::ReduceOpSupports(o.redop, o.dtype), "pg-bench: -r ",
               RedOpName(o.redop), " needs a floating-point datatype, got -d ",
               NcclTypeName(o.dtype), " (for ", op->name, ")");
  }
  return o;
}

}  // namespace fsdp::bench
