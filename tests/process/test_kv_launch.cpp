// Process tests of kv_launch: it is run for real, with a stand-in shell script as the server
// (written here to a temporary directory) and /bin/sh -c '...' as the worker program.
#include <doctest/doctest.h>

#include "support/process.hpp"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef KV_LAUNCH_PATH
#error "KV_LAUNCH_PATH must name the kv_launch binary (set in tests/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using kvtest::read_file;
using temp_dir = kvtest::temp_dir;

void write_script(const fs::path& p, const std::string& body) {
  std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
  fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The server stand-in: reports its role and environment, then does what `tail` says.
fs::path standin_server(const temp_dir& dir, const std::string& tail = "exit 0") {
  auto p = dir / "server.sh";
  write_script(p,
               "echo \"role=$KVSTORE_ROLE rank=${KVSTORE_RANK-none} args=$*"
               " sched=$KVSTORE_SCHEDULER w=$KVSTORE_NUM_WORKERS s=$KVSTORE_NUM_SERVERS"
               " type=${KVSTORE_TYPE-unset} token=${KVSTORE_TOKEN-unset}\"\n" +
                   tail);
  return p;
}

// kv_launch started with stdout and stderr into files in `dir`.
struct launched {
  kvtest::child proc;
  std::string out, err;
  std::chrono::steady_clock::time_point began = std::chrono::steady_clock::now();
};

launched start(const temp_dir& dir, const std::vector<std::string>& args) {
  launched l{{}, dir / "launch.out", dir / "launch.err"};
  std::vector<std::string> argv{KV_LAUNCH_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  l.proc = kvtest::spawn(std::move(argv), kvtest::environment(), l.out, l.err);
  return l;
}

struct result {
  int code = -1;  // exit code, or 128+signal if kv_launch itself was killed
  std::string out, err;
  std::chrono::duration<double> elapsed{};
};

// Waits for kv_launch (every case gives it --timeout 50 or less; -1 if it still runs after 100 s).
result finish(launched& l) {
  result r;
  r.code = l.proc.wait_exit(100s);
  r.elapsed = std::chrono::steady_clock::now() - l.began;
  r.out = read_file(l.out);
  r.err = read_file(l.err);
  return r;
}

result run(const temp_dir& dir, const std::vector<std::string>& args) {
  auto l = start(dir, args);
  auto r = finish(l);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  return r;
}

bool wait_for_file(const fs::path& p, std::chrono::seconds limit) {
  return kvtest::wait_until([&] { return fs::exists(p); }, limit);
}

// Every line must carry exactly one known prefix; returns the lines grouped by prefix.
std::map<std::string, std::vector<std::string>> by_prefix(const std::string& text) {
  static const std::regex prefixed(R"(^\[(scheduler|server \d+|worker \d+)\] (.*)$)");
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& line : lines_of(text)) {
    std::smatch m;
    INFO("line: " << line.substr(0, 200));
    REQUIRE(std::regex_match(line, m, prefixed));
    groups[m[1]].push_back(m[2]);
  }
  return groups;
}

}  // namespace

TEST_CASE("prefixes every line with role and rank, keeps long lines whole, flushes partial lines" *
          doctest::timeout(60)) {
  temp_dir dir;
  auto server = standin_server(dir);
  // Three workers write 300 lines each of 6000 characters (more than a pipe's atomic write) to
  // stdout and shorter ones to stderr at the same time, then a last line with no newline.
  std::string worker =
      "pad=$(printf '%06000d' 0); i=0; while [ $i -lt 300 ]; do "
      "echo \"w$KVSTORE_RANK:$i:$pad\"; echo \"e$KVSTORE_RANK:$i\" >&2; i=$((i+1)); done; "
      "printf \"tail of $KVSTORE_RANK\"";
  auto r = run(dir, {"-w", "3", "-s", "2", "--server", server.string(), "--timeout", "50", "--",
                     "/bin/sh", "-c", worker});
  CHECK(r.code == 0);

  auto out = by_prefix(r.out);
  auto err = by_prefix(r.err);
  CHECK(out.size() == 6);  // scheduler, 2 servers, 3 workers
  CHECK(out.count("scheduler") == 1);
  CHECK(out.count("server 1") == 1);
  const std::string pad(6000, '0');
  for (int w = 0; w < 3; ++w) {
    auto label = "worker " + std::to_string(w);
    const auto& lines = out[label];
    REQUIRE(lines.size() == 301);
    for (int i = 0; i < 300; ++i)
      REQUIRE(lines[i] == "w" + std::to_string(w) + ":" + std::to_string(i) + ":" + pad);
    CHECK(lines[300] == "tail of " + std::to_string(w));
    const auto& elines = err[label];
    REQUIRE(elines.size() == 300);
    for (int i = 0; i < 300; ++i)
      REQUIRE(elines[i] == "e" + std::to_string(w) + ":" + std::to_string(i));
  }
}

TEST_CASE("children get the scheduler address, counts, role, rank, type and token" *
          doctest::timeout(60)) {
  temp_dir dir;
  auto server = standin_server(dir);
  ::setenv("KVSTORE_TOKEN", "s3cret", 1);
  ::setenv("KVSTORE_RANK", "99", 1);  // a stale value from the caller must not leak through
  std::string worker =
      "echo \"role=$KVSTORE_ROLE rank=$KVSTORE_RANK sched=$KVSTORE_SCHEDULER "
      "w=$KVSTORE_NUM_WORKERS s=$KVSTORE_NUM_SERVERS type=$KVSTORE_TYPE token=$KVSTORE_TOKEN\"";

  SUBCASE("fixed port and type") {
    auto r = run(dir, {"-w", "2", "-s", "2", "--port", "45123", "--type", "dist_async", "--server",
                       server.string(), "--timeout", "50", "--", "/bin/sh", "-c", worker});
    CHECK(r.code == 0);
    auto out = by_prefix(r.out);
    const std::string common = "sched=127.0.0.1:45123 w=2 s=2 type=dist_async token=s3cret";
    CHECK(out["scheduler"] ==
          std::vector<std::string>{"role=scheduler rank=none args=--role scheduler " + common});
    for (int i = 0; i < 2; ++i) {
      auto rank = std::to_string(i);
      CHECK(out["server " + rank] ==
            std::vector<std::string>{"role=server rank=" + rank + " args=--role server " + common});
      CHECK(out["worker " + rank] ==
            std::vector<std::string>{"role=worker rank=" + rank + " " + common});
    }
  }
  SUBCASE("picked port is the same for everyone; type inherited when not given") {
    ::setenv("KVSTORE_TYPE", "dist_sync", 1);
    auto r = run(dir, {"-w", "3", "-s", "1", "--server", server.string(), "--timeout", "50",
                       "/bin/sh", "-c", worker});
    ::unsetenv("KVSTORE_TYPE");
    CHECK(r.code == 0);
    std::set<std::string> addresses;
    static const std::regex sched(R"(sched=(127\.0\.0\.1:(\d+)) )");
    for (const auto& [label, lines] : by_prefix(r.out)) {
      REQUIRE(lines.size() == 1);
      std::smatch m;
      REQUIRE(std::regex_search(lines[0], m, sched));
      int port = std::stoi(m[2]);
      CHECK(port > 0);
      CHECK(port < 65536);
      addresses.insert(m[1]);
      CHECK(lines[0].find("type=dist_sync") != std::string::npos);
    }
    CHECK(addresses.size() == 1);
  }
  SUBCASE("server binary from KVSTORE_SERVER_BIN") {
    ::setenv("KVSTORE_SERVER_BIN", server.c_str(), 1);
    auto r = run(dir, {"-w", "1", "-s", "1", "--timeout", "50", "/bin/true"});
    ::unsetenv("KVSTORE_SERVER_BIN");
    CHECK(r.code == 0);
    auto out = by_prefix(r.out);
    REQUIRE(out["server 0"].size() == 1);
    CHECK(out["server 0"][0].starts_with("role=server rank=0 args=--role server"));
  }
  ::unsetenv("KVSTORE_TOKEN");
  ::unsetenv("KVSTORE_RANK");
}

TEST_CASE("children inherit no descriptors beyond stdin, stdout and stderr" *
          doctest::timeout(60)) {
  temp_dir dir;
  auto server = standin_server(dir);
  // ls run directly as the worker (a shell would hold pipeline descriptors of its own) lists
  // what it was started with, plus the one it opens to read the directory.
  auto r = run(dir, {"-w", "2", "-s", "1", "--server", server.string(), "--timeout", "50", "ls",
                     "-1", "/proc/self/fd"});
  CHECK(r.code == 0);
  auto out = by_prefix(r.out);
  for (const char* w : {"worker 0", "worker 1"})
    CHECK(out[w] == std::vector<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("a failing worker's exit code becomes kv_launch's, and the rest are terminated" *
          doctest::timeout(60)) {
  temp_dir dir;
  SUBCASE("exit code 3, the others finish normally") {
    auto server = standin_server(dir);
    auto r = run(dir, {"-w", "3", "-s", "1", "--server", server.string(), "--timeout", "50",
                       "/bin/sh", "-c", "[ $KVSTORE_RANK = 1 ] && exit 3; exit 0"});
    CHECK(r.code == 3);
    CHECK(r.err.find("kv_launch: worker 1 exited with code 3") != std::string::npos);
  }
  SUBCASE("killed by a signal: 128 + signal") {
    auto server = standin_server(dir);
    auto r = run(dir, {"-w", "2", "-s", "1", "--server", server.string(), "--timeout", "50",
                       "/bin/sh", "-c", "[ $KVSTORE_RANK = 0 ] && kill -9 $$; exit 0"});
    CHECK(r.code == 128 + 9);
    CHECK(r.err.find("kv_launch: worker 0 killed by signal 9") != std::string::npos);
  }
  SUBCASE("a worker that would hang after another failed is terminated after the grace") {
    auto server = standin_server(dir, "exec sleep 1000");
    auto r =
        run(dir, {"-w", "2", "-s", "1", "--server", server.string(), "--grace", "1", "--timeout",
                  "50", "/bin/sh", "-c", "[ $KVSTORE_RANK = 1 ] && exit 5; exec sleep 1000"});
    CHECK(r.code == 5);  // the first failure, not the terminated ones
    CHECK(r.err.find("kv_launch: worker 1 exited with code 5") != std::string::npos);
    CHECK(r.err.find("kv_launch: worker 0 killed by signal 15") != std::string::npos);
    CHECK(r.err.find("kv_launch: server 0 killed by signal 15") != std::string::npos);
    CHECK(r.elapsed < 20s);
  }
  SUBCASE("a failing server") {
    auto server = standin_server(dir, "[ \"$KVSTORE_ROLE\" = server ] && exit 7; exec sleep 1000");
    auto r = run(dir, {"-w", "1", "-s", "2", "--server", server.string(), "--grace", "1",
                       "--timeout", "50", "sleep", "1000"});
    CHECK(r.code == 7);
    CHECK(r.err.find("exited with code 7") != std::string::npos);
    CHECK(r.elapsed < 20s);
  }
  SUBCASE("a worker program that does not exist: 127") {
    auto server = standin_server(dir, "exec sleep 1000");
    auto r = run(dir, {"-w", "1", "-s", "1", "--server", server.string(), "--timeout", "50",
                       "/nonexistent/program"});
    CHECK(r.code == 127);
    CHECK(r.err.find("cannot start worker 0") != std::string::npos);
    CHECK(r.elapsed < 20s);
  }
}

TEST_CASE("servers that outlive the workers are terminated after the grace period" *
          doctest::timeout(60)) {
  temp_dir dir;
  SUBCASE("servers exit by themselves: success, no waiting") {
    auto server = standin_server(dir, "sleep 0.2; exit 0");
    auto r = run(
        dir, {"-w", "2", "-s", "2", "--server", server.string(), "--timeout", "50", "/bin/true"});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    CHECK(r.elapsed < 10s);
  }
  SUBCASE("a server that never exits") {
    auto server = standin_server(dir, "[ \"$KVSTORE_ROLE\" = server ] && exec sleep 1000; exit 0");
    auto began = std::chrono::steady_clock::now();
    auto r = run(dir, {"-w", "1", "-s", "1", "--server", server.string(), "--grace", "1",
                       "--timeout", "50", "/bin/true"});
    CHECK(r.code == 128 + 15);  // a process that had to be terminated counts as failed
    CHECK(r.err.find("server 0 still running 1 s after the last worker exited") !=
          std::string::npos);
    CHECK(r.elapsed >= 1s);
    CHECK(r.elapsed < 10s);
    (void)began;
  }
  SUBCASE("a server that ignores SIGTERM is killed 3 s later") {
    auto server = standin_server(
        dir,
        "[ \"$KVSTORE_ROLE\" = server ] && { trap '' TERM; while :; do sleep 1; done; }; exit 0");
    auto r = run(dir, {"-w", "1", "-s", "1", "--server", server.string(), "--grace", "0.5",
                       "--timeout", "50", "/bin/true"});
    CHECK(r.code == 128 + 9);
    CHECK(r.err.find("killing server 0") != std::string::npos);
    CHECK(r.elapsed >= 3s);
    CHECK(r.elapsed < 15s);
  }
}

TEST_CASE("--timeout terminates a hanging job and exits 124" * doctest::timeout(60)) {
  temp_dir dir;
  auto server = standin_server(dir, "exec sleep 1000");
  auto r = run(
      dir, {"-w", "2", "-s", "1", "--server", server.string(), "--timeout", "1", "sleep", "1000"});
  CHECK(r.code == 124);
  CHECK(r.err.find("timed out after 1 s") != std::string::npos);
  CHECK(r.elapsed >= 1s);
  CHECK(r.elapsed < 10s);
}

TEST_CASE("SIGINT to kv_launch reaches every child once, and kv_launch exits non-zero" *
          doctest::timeout(60)) {
  temp_dir dir;
  auto d = dir.path().string();
  // Each process counts the SIGINTs it gets in a file, then exits 0 when told so; `ready_*` says
  // the trap is installed.
  std::string trap_body = "trap 'echo int >> " + d +
                          "/int_$KVSTORE_ROLE$KVSTORE_RANK; exit 0' INT; "
                          "touch " +
                          d +
                          "/ready_$KVSTORE_ROLE$KVSTORE_RANK; "
                          "while :; do sleep 0.05; done";
  auto server = standin_server(dir, trap_body);
  auto l = start(dir, {"-w", "2", "-s", "1", "--server", server.string(), "--timeout", "50",
                       "/bin/sh", "-c", trap_body});
  const std::vector<std::string> names{"scheduler", "server0", "worker0", "worker1"};
  for (const auto& n : names) REQUIRE(wait_for_file(dir / ("ready_" + n), 20s));
  REQUIRE(::kill(l.proc.pid(), SIGINT) == 0);
  auto r = finish(l);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGINT);
  CHECK(r.err.find("received SIGINT; forwarding it") != std::string::npos);
  for (const auto& n : names) CHECK(read_file(dir / ("int_" + n)) == "int\n");
}

TEST_CASE("bad arguments print the usage and exit 2; --help exits 0" * doctest::timeout(60)) {
  temp_dir dir;
  const std::vector<std::vector<std::string>> bad{
      {},
      {"-s", "1", "true"},     // no -w
      {"-w", "1", "true"},     // no -s
      {"-w", "1", "-s", "1"},  // no program
      {"-w", "0", "-s", "1", "true"},
      {"-w", "x", "-s", "1", "true"},
      {"-w", "1", "-s", "1", "--port", "70000", "true"},
      {"-w", "1", "-s", "1", "--type", "local", "true"},
      {"-w", "1", "-s", "1", "--grace", "-1", "true"},
      {"-w", "1", "-s", "1", "--timeout", "soon", "true"},
      {"-w", "1", "-s", "1", "--bogus", "true"},
      {"-w"},
  };
  for (const auto& args : bad) {
    auto r = run(dir, args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    INFO("args: " << joined);
    CHECK(r.code == 2);
    CHECK(r.err.find("usage: kv_launch") != std::string::npos);
    CHECK(r.out.empty());
  }
  auto r = run(dir, {"--help"});
  CHECK(r.code == 0);
  CHECK(r.out.find("usage: kv_launch") != std::string::npos);
  // Attached forms parse too.
  auto server = standin_server(dir);
  auto ok = run(dir, {"-w2", "--servers=1", "--server=" + server.string(), "--timeout=50", "true"});
  CHECK(ok.code == 0);
}

TEST_CASE("a value out of range or of the wrong type is refused naming the option" *
          doctest::timeout(60)) {
  temp_dir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad{
      {{"-w", "1", "-s", "1", "--port", "70000", "true"},
       "the argument ('70000') for option '--port' is out of range: it must be from 1 to 65535"},
      {{"-w", "0", "-s", "1", "true"},
       "option '--workers' is out of range: it must be from 1 to 4096"},
      {{"-w", "1", "-s", "5000", "true"}, "option '--servers' is out of range"},
      {{"-w", "x", "-s", "1", "true"}, "the argument ('x') for option '--workers' is invalid"},
      {{"-w", "1", "-s", "1", "--grace", "-1", "true"}, "option '--grace' is out of range"},
      {{"-w", "1", "-s", "1", "--timeout", "soon", "true"}, "option '--timeout' is invalid"},
      {{"-w", "1", "-s", "1", "--timeout", "0", "true"}, "--timeout must be positive"},
  };
  for (const auto& [args, says] : bad) {
    auto r = run(dir, args);
    INFO("expected: " << says);
    CHECK(r.code == 2);
    CHECK(r.err.starts_with("kv_launch: "));
    CHECK(r.err.find(says) != std::string::npos);
  }
}

TEST_CASE(
    "--colocated: no server process, every child told KVSTORE_COLOCATED=1 and W servers; "
    "-s that differs from -w is refused naming both" *
    doctest::timeout(60)) {
  temp_dir dir;
  auto server = standin_server(dir);
  ::setenv("KVSTORE_COLOCATED", "1", 1);  // a stale value must not reach a plain job
  std::string worker =
      "echo \"role=$KVSTORE_ROLE rank=$KVSTORE_RANK w=$KVSTORE_NUM_WORKERS "
      "s=$KVSTORE_NUM_SERVERS colocated=${KVSTORE_COLOCATED-unset}\"";
  auto plain = run(dir, {"-w", "1", "-s", "1", "--server", server.string(), "--timeout", "50",
                         "/bin/sh", "-c", worker});
  ::unsetenv("KVSTORE_COLOCATED");
  CHECK(plain.code == 0);
  CHECK(by_prefix(plain.out)["worker 0"] ==
        std::vector<std::string>{"role=worker rank=0 w=1 s=1 colocated=unset"});

  for (std::vector<std::string> sizes :
       {std::vector<std::string>{"-w", "3", "--colocated"},
        std::vector<std::string>{"--colocated", "-w", "3", "-s", "3"}}) {
    auto args = sizes;
    for (const std::string& a : std::vector<std::string>{"--server", server.string(), "--timeout",
                                                         "50", "/bin/sh", "-c", worker})
      args.push_back(a);
    auto r = run(dir, args);
    CHECK(r.code == 0);
    auto out = by_prefix(r.out);
    CHECK(out.size() == 4);  // the scheduler and three workers, no server
    REQUIRE(out["scheduler"].size() == 1);
    CHECK(out["scheduler"][0].find("role=scheduler") != std::string::npos);
    CHECK(out["scheduler"][0].find("w=3 s=3") != std::string::npos);
    for (int i = 0; i < 3; ++i)
      CHECK(out["worker " + std::to_string(i)] ==
            std::vector<std::string>{"role=worker rank=" + std::to_string(i) +
                                     " w=3 s=3 colocated=1"});
  }

  auto r = run(dir, {"-w", "2", "-s", "3", "--colocated", "true"});
  CHECK(r.code == 2);
  CHECK(r.err.find("-s 3 differs from -w 2") != std::string::npos);
  CHECK(r.out.empty());
}
