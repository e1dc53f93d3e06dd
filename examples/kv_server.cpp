// kv_server: a scheduler or a server process built from the kvstore headers.
//   kv_server --role scheduler|server   (or KVSTORE_ROLE / DMLC_ROLE)
// Everything else comes from the same environment as a worker's (KVSTORE_SCHEDULER, ...).
// A server built this way knows the built-in optimizers; a program that registers its own
// optimizer types runs its servers itself (construct KVStore<dist> with role server, or build a
// server like this one that includes the registration).
#include <kvstore/kvstore.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace {

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: kv_server [--role scheduler|server] [--port P]\n"
               "  Runs a kvstore scheduler or server until the job ends.\n"
               "  Configured by the environment: KVSTORE_ROLE, KVSTORE_SCHEDULER=host:port,\n"
               "  KVSTORE_NUM_WORKERS, KVSTORE_NUM_SERVERS, KVSTORE_TYPE, KVSTORE_TOKEN\n"
               "  (DMLC_ROLE, DMLC_PS_ROOT_URI/PORT, DMLC_NUM_WORKER/SERVER also accepted).\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto o = kvstore::dist_options::from_env();
    bool role_given = std::getenv("KVSTORE_ROLE") || std::getenv("DMLC_ROLE");
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        usage(stdout);
        return 0;
      }
      if ((a == "--role" || a == "--port") && i + 1 < argc) {
        std::string v = argv[++i];
        if (a == "--role") {
          o.role = kvstore::dist_options::parse_role(v);
          role_given = true;
        } else {
          o.scheduler_port = static_cast<std::uint16_t>(std::stoi(v));
        }
        continue;
      }
      std::fprintf(stderr, "kv_server: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
    if (!role_given || o.role == kvstore::role::worker) {
      std::fprintf(stderr, "kv_server: give --role scheduler or --role server\n");
      usage(stderr);
      return 2;
    }
    if (o.role == kvstore::role::scheduler) {
      kvstore::scheduler s(o);
      s.run();
    } else {
      kvstore::server s(o);
      // The default command hook: log what was asked, so send_command_to_servers is observable.
      s.on_command([&s](int head, std::string_view body) {
        std::fprintf(stderr, "kv_server %d: command %d: %.*s\n", s.rank(), head,
                     static_cast<int>(body.size()), body.data());
      });
      s.run();
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_server: %s\n", e.what());
    return 1;
  }
}
