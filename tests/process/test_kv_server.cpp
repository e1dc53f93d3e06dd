// kv_server's command line, run for real: --help, and values that are out of range or of the
// wrong type are refused with exit code 2 and a message naming the option (a port above 65535
// used to wrap silently).
#include <doctest/doctest.h>

#include "support/process.hpp"

#include <chrono>
#include <string>
#include <vector>

#ifndef KV_SERVER_PATH
#error "KV_SERVER_PATH must name the kv_server binary (set in tests/CMakeLists.txt)"
#endif

namespace {

using namespace std::chrono_literals;

struct result {
  int code = -1;
  std::string out, err;
};

// kv_server with `args` and no job in the environment: it must answer from its arguments alone.
result run(const std::vector<std::string>& args) {
  kvtest::temp_dir dir{"kvstore-kv-server"};
  std::vector<std::string> argv{KV_SERVER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  auto c = kvtest::spawn(argv, kvtest::clean_environment(), dir / "out", dir / "err");
  result r;
  r.code = c.wait_exit(20s);
  r.out = kvtest::read_file(dir / "out");
  r.err = kvtest::read_file(dir / "err");
  return r;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("--help prints the usage and the options, exit 0" * doctest::timeout(30)) {
  for (const char* h : {"--help", "-h"}) {
    auto r = run({h});
    INFO(h << "\nstdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.code == 0);
    CHECK(has(r.out, "usage: kv_server"));
    CHECK(has(r.out, "--role"));
    CHECK(has(r.out, "--port"));
  }
}

TEST_CASE("a port out of 0..65535 is an error naming the option and the range" *
          doctest::timeout(30)) {
  for (const char* port : {"99999", "65536", "-1"}) {
    auto r = run({"--role", "scheduler", "--port", port});
    INFO("--port " << port << "\nstderr:\n" << r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, "'--port'"));
    CHECK(has(r.err, "out of range"));
    CHECK(has(r.err, "0 to 65535"));
    CHECK(has(r.err, "usage: kv_server"));
  }
}

TEST_CASE("a value of the wrong type, an unknown option or a missing value is an error, exit 2" *
          doctest::timeout(30)) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad{
      {{"--role", "server", "--port", "abc"}, "'--port' is invalid"},
      {{"--role", "server", "--port", "12x"}, "'--port' is invalid"},
      {{"--role", "server", "--bogus"}, "--bogus"},
      {{"--role"}, "--role"},
      {{"--role", "server", "extra"}, "positional"},
  };
  for (const auto& [args, says] : bad) {
    auto r = run(args);
    INFO("args: " << args.size() << " starting " << args.front() << "\nstderr:\n" << r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, says));
    CHECK(r.out.empty());
  }
}

TEST_CASE("no role, or the worker role, is refused with exit 2" * doctest::timeout(30)) {
  for (const auto& args : std::vector<std::vector<std::string>>{{}, {"--role", "worker"}}) {
    auto r = run(args);
    INFO("stderr:\n" << r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, "give --role scheduler or --role server"));
  }
}
