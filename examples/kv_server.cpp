// kv_server: a scheduler or a server process built from the kvstore headers.
//   kv_server --role scheduler|server [--port P]   (or KVSTORE_ROLE / DMLC_ROLE)
// Everything else comes from the same environment as a worker's (KVSTORE_SCHEDULER, ...).
// A server built this way knows the built-in optimizers; a program that registers its own
// optimizer types runs its servers itself (construct KVStore<dist> with role server, or build a
// server like this one that includes the registration).
#include <kvstore/kvstore.hpp>

#include "cli.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace po = boost::program_options;

int main(int argc, char** argv) {
  std::string role;
  int port = -1;
  po::options_description opts(
      "usage: kv_server [--role scheduler|server] [--port P]\n"
      "  Runs a kvstore scheduler or server until the job ends.\n"
      "  Configured by the environment: KVSTORE_ROLE, KVSTORE_SCHEDULER=host:port,\n"
      "  KVSTORE_NUM_WORKERS, KVSTORE_NUM_SERVERS, KVSTORE_TYPE, KVSTORE_TOKEN\n"
      "  (DMLC_ROLE, DMLC_PS_ROOT_URI/PORT, DMLC_NUM_WORKER/SERVER also accepted).\n\n"
      "options");
  // clang-format off
  opts.add_options()
      ("role", po::value(&role)->value_name("R"), "scheduler or server (default: $KVSTORE_ROLE, $DMLC_ROLE)")
      ("port", kvtool::ranged(&port, 0, 65535)->value_name("P"),
       "the scheduler's port (default: the port of $KVSTORE_SCHEDULER)")
      ("help,h", "show this help");
  // clang-format on
  try {
    po::variables_map vm;
    // No positional arguments: a stray word is an error, not ignored.
    po::store(po::command_line_parser(argc, argv).options(opts).positional({}).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << opts;
      return 0;
    }
  } catch (const po::error& e) {
    std::cerr << "kv_server: " << e.what() << "\n" << opts;
    return 2;
  }
  try {
    auto o = kvstore::dist_options::from_env();
    bool role_given = std::getenv("KVSTORE_ROLE") || std::getenv("DMLC_ROLE");
    if (!role.empty()) {
      o.role = kvstore::dist_options::parse_role(role);
      role_given = true;
    }
    if (port >= 0) o.scheduler_port = static_cast<std::uint16_t>(port);
    if (!role_given || o.role == kvstore::role::worker) {
      std::cerr << "kv_server: give --role scheduler or --role server\n" << opts;
      return 2;
    }
    kvstore::node_loop node(o);
    if (o.role == kvstore::role::server) {
      // The default command hook: log what was asked, so send_command_to_servers is observable.
      node.on_command([&node](int head, std::string_view body) {
        std::fprintf(stderr, "kv_server %d: command %d: %.*s\n", node.rank(), head,
                     static_cast<int>(body.size()), body.data());
      });
    }
    node.run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_server: %s\n", e.what());
    return 1;
  }
}
