// Command handlers of servers launched SPMD: this test binary registers two handlers and is
// re-executed as the job's scheduler and server (every process the same binary, as under mpirun),
// while its own process is the worker. The server must run both handlers in order, fail a call
// whose handler throws with the handler's message, and keep serving.
#include <kvstore/kvstore.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

// Appends "<tag> <head>:<body>" to the file named by KVTEST_COMMAND_LOG (the server's), so the
// test can see what ran and in which order.
void log_command(const char* tag, int head, std::string_view body) {
  const char* path = std::getenv("KVTEST_COMMAND_LOG");
  if (!path) return;
  std::ofstream(path, std::ios::app) << tag << " " << head << ":" << body << "\n";
}

// A node's run() on a thread of the test: how it ends (the job over, or stopped) is not checked.
void run_quietly(kvstore::node_loop& n) {
  try {
    n.run();
  } catch (const std::exception&) {
  }
}

}  // namespace

KVSTORE_REGISTER_COMMAND_HANDLER([](int head, std::string_view body) {
  log_command("first", head, body);
  if (head == 13) throw std::runtime_error("the handler refuses head 13");
});
KVSTORE_REGISTER_COMMAND_HANDLER([](int head, std::string_view body) {
  log_command("second", head, body);
});

// With KVTEST_SPMD_CHILD set, this case is one process of the job in the role its environment
// gives: the KVStore<dist> constructor runs the scheduler or server loop and exits the process.
// In a normal run it does nothing.
TEST_CASE("spmd child (runs only when re-executed by the command-handler test)" *
          doctest::timeout(90)) {
  if (!std::getenv("KVTEST_SPMD_CHILD")) return;
  try {
    kvstore::KVStore<kvstore::dist> kv;
  } catch (const std::exception& e) {
    std::printf("spmd child failed: %s\n", e.what());
  }
  std::_Exit(1);  // a server or scheduler exits inside the constructor
}

TEST_CASE("servers launched SPMD run the program's registered command handlers" *
          doctest::timeout(120)) {
  kvtest::temp_dir dir("kvstore-spmd");
  const std::uint16_t port = kvtest::free_port();
  const std::string log = dir / "commands.log";
  auto env = [&](const std::string& role) {
    auto e = kvtest::clean_environment();
    e.insert(e.end(),
             {"KVTEST_SPMD_CHILD=1", "KVSTORE_ROLE=" + role,
              "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(port), "KVSTORE_NUM_WORKERS=1",
              "KVSTORE_NUM_SERVERS=1", "KVTEST_COMMAND_LOG=" + log});
    return e;
  };
  const std::vector<std::string> argv = {"/proc/self/exe", "--test-case=spmd child*"};
  auto sched = kvtest::spawn(argv, env("scheduler"), dir / "scheduler.out", dir / "scheduler.out");
  auto server = kvtest::spawn(argv, env("server"), dir / "server.out", dir / "server.out");
  INFO(kvtest::read_file(dir / "scheduler.out") << kvtest::read_file(dir / "server.out"));

  auto o = kvtest::test_options(1, 1);
  o.scheduler_port = port;
  o.rank_hint = 0;
  kvstore::KVStore<kvstore::dist> kv(o);
  kv.send_command_to_servers(7, "ping");
  CHECK(kvtest::read_file(log) == "first 7:ping\nsecond 7:ping\n");
  kvtest::expect_error([&] { kv.send_command_to_servers(13, "x"); }, kvstore::errc::server_error,
                       {"command 13 failed", "the handler refuses head 13"});
  CHECK(kvtest::read_file(log) == "first 7:ping\nsecond 7:ping\nfirst 13:x\n");
  // The server serves on after a handler threw.
  kv.init(1, kvtest::filled(4, 1.0f));
  kv.push(1, kvtest::filled(4, 3.0f)).wait();
  std::vector<float> out(4);
  kv.pull(1, out).wait();
  CHECK(out == kvtest::filled(4, 3.0f));
}

TEST_CASE("a server whose handlers were taken away answers commands as unsupported" *
          doctest::timeout(60)) {
  // A node_loop runs the program's registered handlers (this binary registers two) unless
  // on_command replaces them; an empty one leaves the server with none.
  auto o = kvtest::test_options(1, 1);
  auto so = o;
  so.role = kvstore::role::scheduler;
  kvstore::node_loop sched(so);
  o.scheduler_port = sched.port();
  auto vo = o;
  vo.role = kvstore::role::server;
  kvstore::node_loop srv(vo);
  srv.on_command({});
  std::thread ts([&] { run_quietly(sched); }), tv([&] { run_quietly(srv); });
  struct stop_all {  // also when a check below throws
    kvstore::node_loop &a, &b;
    std::thread &ta, &tb;
    ~stop_all() {
      a.stop();
      b.stop();
      ta.join();
      tb.join();
    }
  } stop{srv, sched, ts, tv};
  auto wo = o;
  wo.role = kvstore::role::worker;
  kvstore::KVStore<kvstore::dist> kv(wo);
  kvtest::expect_error([&] { kv.send_command_to_servers(1, "x"); }, kvstore::errc::unsupported,
                       {"no command handler"});
}

TEST_CASE("a server of kvstore::node_loop runs the program's registered handlers" *
          doctest::timeout(60)) {
  kvtest::temp_dir dir("kvstore-node-loop");
  const std::string log = dir / "commands.log";
  ::setenv("KVTEST_COMMAND_LOG", log.c_str(), 1);
  kvtest::cluster c(kvtest::test_options(1, 1));  // its servers are node_loops
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) { kv.send_command_to_servers(5, "hi"); });
  ::unsetenv("KVTEST_COMMAND_LOG");
  CHECK(kvtest::read_file(log) == "first 5:hi\nsecond 5:hi\n");
}
