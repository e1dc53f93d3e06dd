// The bodies of harness.hpp: configuration, a process's usage marks and sample lines, the
// phase barrier, the aggregation of samples into figures and the table rows, the --json file.
#include "harness.hpp"

#include "../../tests/support/tcp_bytes.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace kv_bench {

bool config::want(const std::string& name) const {
  if (only.empty()) return true;
  for (std::size_t b = 0; b <= only.size();) {
    std::size_t e = only.find(',', b);
    if (e == std::string::npos) e = only.size();
    if (e > b && name.find(only.substr(b, e - b)) != std::string::npos) return true;
    b = e + 1;
  }
  return false;
}

config make_config(bool quick) {
  config c;
  c.quick = quick;
  if (quick) {
    c.reps = 1;
    c.sizes = {{4 << 10, 50, 50}, {64 << 10, 20, 20}, {4 << 20, 2, 2}};
    c.compressed_sizes = {{4 << 20, 2, 2}};
    c.convert_floats = std::size_t{1} << 20;
    c.latency_n = 100;
    c.pingpong64_n = 100;
    c.many_keys = 100;
    c.many_rounds = 2;
    c.growth_keys = {1000, 10000};
    c.backprop_steps = 2;
  } else {
    c.reps = 5;
    c.sizes = {{4 << 10, 2000, 2000}, {64 << 10, 600, 600}, {4 << 20, 40, 40}, {64 << 20, 4, 4}};
    c.compressed_sizes = {{4 << 20, 40, 40}, {64 << 20, 4, 4}};
  }
  return c;
}

std::string congestion_option() {
  const char* v = std::getenv("KVSTORE_TCP_CONGESTION");
  return v && *v ? v : "auto";
}

// ---- samples -------------------------------------------------------------------------------

namespace {

// CPU time, context switches and TCP bytes of this process (all its threads).
struct rusage_mark {
  double cpu = 0, csw = 0, wire = 0;
};
rusage_mark usage_now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  const auto t = kvtest::tcp_bytes();
  return {tv(ru.ru_utime) + tv(ru.ru_stime), double(ru.ru_nvcsw + ru.ru_nivcsw),
          double(t.sent + t.received)};
}
rusage_mark last_mark;  // each forked process has its own

sample with_usage(sample s) {
  auto u = usage_now();
  s.cpu = u.cpu - last_mark.cpu;
  s.csw = u.csw - last_mark.csw;
  s.wire = u.wire - last_mark.wire;
  return s;
}

}  // namespace

clk::time_point mark() {
  last_mark = usage_now();
  return clk::now();
}

void report(int out, const sample& s) {
  if (s.ops > 0) write_all(out, fmt_sample(with_usage(s)));
}

std::string fmt_sample(const sample& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "S %s %d %.0f %.0f %.9f %.6f %.0f %.0f %.6f\n", s.name.c_str(),
                s.rep, s.ops, s.bytes, s.secs, s.cpu, s.csw, s.wire, s.server_cpu);
  return buf;
}

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  std::size_t left = s.size();
  while (left) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void pipe_barrier::wait() {
  write_all(to_parent, "R\n");
  char c;
  for (;;) {
    ssize_t n = ::read(from_parent, &c, 1);
    if (n == 1) return;
    if (n < 0 && errno == EINTR) continue;
    throw std::runtime_error("the coordinating parent went away");
  }
}

// ---- figures and results -------------------------------------------------------------------

figure aggregate(const std::vector<sample>& all, const std::string& name) {
  std::map<int, std::vector<const sample*>> by_rep;
  for (auto& s : all)
    if (s.name == name) by_rep[s.rep].push_back(&s);
  std::vector<std::pair<double, double>> v;  // ops/s, GB/s
  std::vector<double> cpu, csw, wire, server_cpu;
  for (auto& [rep, ss] : by_rep) {
    double ops = 0, bytes = 0, t = 0, c = 0, w = 0, tcp = 0, sc = 0;
    for (auto* s : ss) {
      ops += s->ops;
      bytes += s->bytes;
      t = std::max(t, s->secs);
      c += s->cpu;
      w += s->csw;
      tcp += s->wire;
      sc = std::max(sc, s->server_cpu);
    }
    if (t > 0) v.push_back({ops / t, bytes / t / 1e9});
    if (ops > 0) {
      cpu.push_back(c / ops * 1e6);
      csw.push_back(w / ops);
      wire.push_back(tcp / ops);
      server_cpu.push_back(sc / ops * 1e6);
    }
  }
  figure f;
  if (v.empty()) return f;
  std::sort(v.begin(), v.end());
  f.present = true;
  f.ops_s = v[v.size() / 2].first;
  f.gb_s = v[v.size() / 2].second;
  f.lo_ops = v.front().first;
  f.hi_ops = v.back().first;
  std::sort(cpu.begin(), cpu.end());
  std::sort(csw.begin(), csw.end());
  f.cpu_us_op = cpu[cpu.size() / 2];
  f.csw_op = csw[csw.size() / 2];
  std::sort(wire.begin(), wire.end());
  f.wire_op = wire[wire.size() / 2];
  std::sort(server_cpu.begin(), server_cpu.end());
  f.server_cpu_us_op = server_cpu[server_cpu.size() / 2];
  return f;
}

std::string human(std::size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= (1u << 10)) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= double(1u << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1u << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

void setup_table::header() const {
  std::printf("  %-8s %-26s %12s %8s %12s %8s %6s | %8s %8s %6s %6s | %11s %11s\n", "size",
              "pattern", "kvstore op/s", "GB/s", "raw TCP op/s", "GB/s", "ratio", "kv cpu",
              "raw cpu", "kv cs", "raw cs", "kv B/op", "raw B/op");
}

void setup_table::row(const std::string& name, const std::string& size, const std::string& pattern,
                      const std::string& base_name) {
  figure k = aggregate(kvs, name), b = aggregate(base, base_name);
  if (!k.present && !b.present) return;
  const double ratio = b.present && b.ops_s > 0 ? k.ops_s / b.ops_s : -1;
  std::printf(
      "  %-8s %-26s %12.0f %8.3f %12.0f %8.3f %6.3f | %8.1f %8.1f %6.2f %6.2f | %11s %11s\n",
      size.c_str(), pattern.c_str(), k.ops_s, k.gb_s, b.ops_s, b.gb_s, ratio, k.cpu_us_op,
      b.cpu_us_op, k.csw_op, b.csw_op, human_bytes(k.wire_op).c_str(),
      b.present ? human_bytes(b.wire_op).c_str() : "-");
  const bool big = name.rfind("push_", 0) == 0 || name.rfind("pull_", 0) == 0;
  if (big) {
    results.push_back(
        {"kv_" + cl + "_" + name + "_GBps", k.gb_s, "GB/s", b.present ? b.gb_s : -1, ratio, cl});
    // Bytes on the wire per op, next to the raw baseline's for the same (plain) payload.
    results.push_back({"kv_" + cl + "_" + name + "_wire_bytes", k.wire_op, "B",
                       b.present ? b.wire_op : -1,
                       b.present && b.wire_op > 0 ? k.wire_op / b.wire_op : -1, cl});
  }
  results.push_back(
      {"kv_" + cl + "_" + name + "_ops", k.ops_s, "ops/s", b.present ? b.ops_s : -1, ratio, cl});
  figs[cl + name] = k;
  figs[cl + name + "#base"] = b;
}

bool write_json(const std::string& path, const std::vector<result>& results) {
  std::ofstream f(path);
  f << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    char buf[512];
    if (r.baseline >= 0)
      std::snprintf(buf, sizeof buf,
                    "  {\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"baseline\": %.6g, "
                    "\"ratio\": %.4f, \"table\": \"%s\"}",
                    r.name.c_str(), r.value, r.unit.c_str(), r.baseline, r.ratio, r.table.c_str());
    else
      std::snprintf(buf, sizeof buf,
                    "  {\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"baseline\": null, "
                    "\"ratio\": null, \"table\": \"%s\"}",
                    r.name.c_str(), r.value, r.unit.c_str(), r.table.c_str());
    f << buf << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "]\n";
  return static_cast<bool>(f);
}

}  // namespace kv_bench
