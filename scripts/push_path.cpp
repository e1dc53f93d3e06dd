// The program scripts/push_path_headers.sh runs under gcov: a scheduler, a server and a worker
// as threads of this process over loopback TCP; the worker inits a 4 KiB key, then pushes it
// and waits N times (N = argv[1]). Whatever runs N times more often is a push's path.
#include <kvstore/kvstore.hpp>

#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const int pushes = argc > 1 ? std::atoi(argv[1]) : 0;
  kvstore::dist_options o;
  o.scheduler_port = 0;
  o.role = kvstore::role::scheduler;
  kvstore::node_loop sched(o);
  o.scheduler_port = sched.port();
  o.role = kvstore::role::server;
  kvstore::node_loop server(o);
  std::thread ts([&] { sched.run(); }), tv([&] { server.run(); });
  {
    o.role = kvstore::role::worker;
    o.threads = 1;
    kvstore::KVStore<kvstore::dist> kv(o);
    std::vector<float> v(1024, 1.0f);
    kv.init(7, v);
    kv.barrier();
    for (int i = 0; i < pushes; ++i) kv.push(7, v).wait();
    kv.barrier();
  }
  server.stop();
  sched.stop();
  ts.join();
  tv.join();
}
