// dist_options::from_env(): the order in which the environment is looked up (KVSTORE_*, then
// DMLC_*, then a launcher's rank), the scheduler address from launchers (MASTER_ADDR/PORT, the
// first host of a Slurm node list), and errors that name the malformed variable.
// Only <kvstore/options.hpp>: this test compiles in seconds.
#include <doctest/doctest.h>

#include <kvstore/options.hpp>

#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

using kvstore::dist_options;
using kvstore::role;

namespace {

// Every variable apply_env() reads (and a few launchers set that it must ignore).
constexpr const char* all_vars[] = {"KVSTORE_ROLE",
                                    "KVSTORE_SCHEDULER",
                                    "KVSTORE_NUM_WORKERS",
                                    "KVSTORE_NUM_SERVERS",
                                    "KVSTORE_TYPE",
                                    "KVSTORE_TOKEN",
                                    "KVSTORE_RANK",
                                    "KVSTORE_BIND",
                                    "KVSTORE_ADVERTISE",
                                    "KVSTORE_ON_WORKER_DEATH",
                                    "KVSTORE_CHECKPOINT_DIR",
                                    "KVSTORE_CHECKPOINT_INTERVAL_MS",
                                    "KVSTORE_CHECKPOINT_ROUNDS",
                                    "KVSTORE_SERVER_RESTART_WAIT_MS",
                                    "KVSTORE_TLS_CERT",
                                    "KVSTORE_TLS_KEY",
                                    "KVSTORE_TLS_CA",
                                    "KVSTORE_MAX_KEY_BYTES",
                                    "KVSTORE_CONNECT_TIMEOUT_MS",
                                    "KVSTORE_REQUEST_TIMEOUT_MS",
                                    "KVSTORE_BARRIER_TIMEOUT_MS",
                                    "KVSTORE_HEARTBEAT_MS",
                                    "KVSTORE_DEAD_TIMEOUT_MS",
                                    "KVSTORE_STALENESS",
                                    "KVSTORE_COLOCATED",
                                    "KVSTORE_MAX_HELD_PULLS",
                                    "KVSTORE_SERVER_THREADS",
                                    "KVSTORE_FUSE_BYTES",
                                    "KVSTORE_FUSE_US",
                                    "DMLC_ROLE",
                                    "DMLC_PS_ROOT_URI",
                                    "DMLC_PS_ROOT_PORT",
                                    "DMLC_NUM_WORKER",
                                    "DMLC_NUM_SERVER",
                                    "OMPI_COMM_WORLD_RANK",
                                    "OMPI_COMM_WORLD_SIZE",
                                    "PMI_RANK",
                                    "PMI_SIZE",
                                    "PMIX_RANK",
                                    "PMIX_SIZE",
                                    "SLURM_PROCID",
                                    "SLURM_NTASKS",
                                    "SLURM_JOB_NODELIST",
                                    "SLURM_NODELIST",
                                    "RANK",
                                    "WORLD_SIZE",
                                    "LOCAL_RANK",
                                    "MASTER_ADDR",
                                    "MASTER_PORT"};

// Clears every variable above for the test's lifetime, sets the given ones, and puts the
// process's environment back as it was when destroyed (ctest may run under mpirun or srun).
class env_guard {
 public:
  explicit env_guard(std::initializer_list<std::pair<const char*, const char*>> vars = {}) {
    for (const char* name : all_vars) {
      if (const char* v = std::getenv(name))
        saved_[name] = v;
      else
        saved_[name] = std::nullopt;
      ::unsetenv(name);
    }
    for (auto& [name, value] : vars) set(name, value);
  }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }
  void unset(const char* name) { ::unsetenv(name); }
  ~env_guard() {
    for (auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// from_env() must throw kvstore::error(invalid_argument) whose message names `var`.
void check_error_names(const char* var) {
  try {
    (void)dist_options::from_env();
    FAIL("no error; expected one naming ", std::string(var));
  } catch (const kvstore::error& e) {
    CHECK(e.code() == kvstore::make_error_code(kvstore::errc::invalid_argument));
    INFO("message: ", std::string(e.what()));
    CHECK(std::string(e.what()).find(var) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("an empty environment gives the defaults") {
  env_guard g;
  const auto o = dist_options::from_env();
  const dist_options d;
  CHECK(o.role == role::worker);
  CHECK(o.scheduler_host == "127.0.0.1");
  CHECK(o.scheduler_port == 9091);
  CHECK(o.num_workers == 1);
  CHECK(o.num_servers == 1);
  CHECK(o.sync);
  CHECK(o.token.empty());
  CHECK(o.rank_hint == -1);
  CHECK(o.on_worker_death == kvstore::worker_death::leave_group);
  CHECK(o.connect_timeout == d.connect_timeout);
  CHECK(o.checkpoint_dir.empty());
}

TEST_CASE("KVSTORE_* variables") {
  env_guard g{{"KVSTORE_ROLE", "server"},
              {"KVSTORE_SCHEDULER", "10.1.2.3:7000"},
              {"KVSTORE_NUM_WORKERS", "8"},
              {"KVSTORE_NUM_SERVERS", "3"},
              {"KVSTORE_TYPE", "dist_async"},
              {"KVSTORE_TOKEN", "s3cret"},
              {"KVSTORE_RANK", "2"},
              {"KVSTORE_BIND", "0.0.0.0"},
              {"KVSTORE_ADVERTISE", "10.1.2.9"},
              {"KVSTORE_ON_WORKER_DEATH", "fail"},
              {"KVSTORE_CHECKPOINT_DIR", "/var/kv"},
              {"KVSTORE_CHECKPOINT_INTERVAL_MS", "1500"},
              {"KVSTORE_CHECKPOINT_ROUNDS", "10"},
              {"KVSTORE_SERVER_RESTART_WAIT_MS", "20000"},
              {"KVSTORE_TLS_CERT", "/c.pem"},
              {"KVSTORE_TLS_KEY", "/k.pem"},
              {"KVSTORE_TLS_CA", "/ca.pem"},
              {"KVSTORE_CONNECT_TIMEOUT_MS", "1000"},
              {"KVSTORE_REQUEST_TIMEOUT_MS", "2000"},
              {"KVSTORE_BARRIER_TIMEOUT_MS", "3000"},
              {"KVSTORE_HEARTBEAT_MS", "100"},
              {"KVSTORE_DEAD_TIMEOUT_MS", "4000"},
              {"KVSTORE_WAIT_SPIN_US", "0"}};
  const auto o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.scheduler_host == "10.1.2.3");
  CHECK(o.scheduler_port == 7000);
  CHECK(o.num_workers == 8);
  CHECK(o.num_servers == 3);
  CHECK_FALSE(o.sync);
  CHECK(o.type_name() == "dist_async");
  CHECK(o.token == "s3cret");
  CHECK(o.rank_hint == 2);
  CHECK(o.bind_host == "0.0.0.0");
  CHECK(o.advertise_host == "10.1.2.9");
  CHECK(o.on_worker_death == kvstore::worker_death::fail);
  CHECK(o.checkpoint_dir == "/var/kv");
  CHECK(o.checkpoint_interval == std::chrono::milliseconds(1500));
  CHECK(o.checkpoint_rounds == 10);
  CHECK(o.server_restart_wait == std::chrono::milliseconds(20000));
  CHECK(o.tls_cert == "/c.pem");
  CHECK(o.tls_key == "/k.pem");
  CHECK(o.tls_ca == "/ca.pem");
  CHECK(o.connect_timeout == std::chrono::milliseconds(1000));
  CHECK(o.request_timeout == std::chrono::milliseconds(2000));
  CHECK(o.barrier_timeout == std::chrono::milliseconds(3000));
  CHECK(o.heartbeat_interval == std::chrono::milliseconds(100));
  CHECK(o.dead_timeout == std::chrono::milliseconds(4000));
  CHECK(o.wait_spin == std::chrono::microseconds(0));
}

TEST_CASE("KVSTORE_TYPE accepts dist, dist_sync and dist_async") {
  env_guard g{{"KVSTORE_TYPE", "dist"}};
  CHECK(dist_options::from_env().sync);
  g.set("KVSTORE_TYPE", "dist_sync");
  CHECK(dist_options::from_env().sync);
  g.set("KVSTORE_TYPE", "dist_async");
  CHECK_FALSE(dist_options::from_env().sync);
}

TEST_CASE("DMLC_* variables as dmlc-tracker / MXNet launch.py set them") {
  env_guard g{{"DMLC_ROLE", "scheduler"},
              {"DMLC_PS_ROOT_URI", "10.0.0.5"},
              {"DMLC_PS_ROOT_PORT", "9000"},
              {"DMLC_NUM_WORKER", "4"},
              {"DMLC_NUM_SERVER", "2"}};
  auto o = dist_options::from_env();
  CHECK(o.role == role::scheduler);
  CHECK(o.scheduler_host == "10.0.0.5");
  CHECK(o.scheduler_port == 9000);
  CHECK(o.num_workers == 4);
  CHECK(o.num_servers == 2);

  SUBCASE("only the port") {
    g.unset("DMLC_PS_ROOT_URI");
    o = dist_options::from_env();
    CHECK(o.scheduler_host == "127.0.0.1");
    CHECK(o.scheduler_port == 9000);
  }
}

TEST_CASE("KVSTORE_* comes before DMLC_*") {
  env_guard g{
      {"KVSTORE_ROLE", "server"}, {"DMLC_ROLE", "scheduler"},    {"KVSTORE_SCHEDULER", "h1:1111"},
      {"DMLC_PS_ROOT_URI", "h2"}, {"DMLC_PS_ROOT_PORT", "2222"}, {"KVSTORE_NUM_WORKERS", "5"},
      {"DMLC_NUM_WORKER", "6"},   {"KVSTORE_NUM_SERVERS", "7"},  {"DMLC_NUM_SERVER", "8"}};
  const auto o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.scheduler_host == "h1");
  CHECK(o.scheduler_port == 1111);
  CHECK(o.num_workers == 5);
  CHECK(o.num_servers == 7);
}

TEST_CASE("an empty variable counts as unset") {
  env_guard g{{"KVSTORE_ROLE", ""},
              {"DMLC_ROLE", "server"},
              {"KVSTORE_NUM_WORKERS", ""},
              {"DMLC_NUM_WORKER", "3"},
              {"KVSTORE_SCHEDULER", ""}};
  const auto o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.num_workers == 3);
  CHECK(o.scheduler_port == 9091);
}

TEST_CASE(
    "a launcher's rank: rank 0 scheduler, the next num_servers ranks servers, the rest workers") {
  env_guard g{{"OMPI_COMM_WORLD_SIZE", "6"}, {"KVSTORE_NUM_SERVERS", "2"}};
  struct expect {
    int rank;
    role r;
    int hint;
  };
  for (auto e :
       {expect{0, role::scheduler, -1}, expect{1, role::server, 0}, expect{2, role::server, 1},
        expect{3, role::worker, 0}, expect{4, role::worker, 1}, expect{5, role::worker, 2}}) {
    CAPTURE(e.rank);
    g.set("OMPI_COMM_WORLD_RANK", std::to_string(e.rank).c_str());
    const auto o = dist_options::from_env();
    CHECK(o.role == e.r);
    CHECK(o.rank_hint == e.hint);
    CHECK(o.num_servers == 2);
    CHECK(o.num_workers == 3);  // 6 - 1 scheduler - 2 servers
    CHECK(o.scheduler_host == "127.0.0.1");
    CHECK(o.scheduler_port == 9091);
  }
}

TEST_CASE("without KVSTORE_NUM_SERVERS a launcher's job has one server") {
  env_guard g{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}};
  auto o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.num_servers == 1);
  CHECK(o.num_workers == 2);
  g.set("SLURM_PROCID", "3");
  o = dist_options::from_env();
  CHECK(o.role == role::worker);
  CHECK(o.rank_hint == 1);
  // DMLC_NUM_SERVER counts as given too.
  g.set("DMLC_NUM_SERVER", "2");
  o = dist_options::from_env();
  CHECK(o.role == role::worker);
  CHECK(o.rank_hint == 0);
  CHECK(o.num_workers == 1);
  g.set("SLURM_PROCID", "2");
  o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.rank_hint == 1);
}

TEST_CASE("launchers in order: Open MPI, PMI, PMIx, Slurm, torchrun") {
  env_guard g{{"OMPI_COMM_WORLD_RANK", "0"},
              {"OMPI_COMM_WORLD_SIZE", "3"},
              {"PMI_RANK", "1"},
              {"PMI_SIZE", "3"},
              {"PMIX_RANK", "2"},
              {"PMIX_SIZE", "4"},
              {"SLURM_PROCID", "3"},
              {"SLURM_NTASKS", "5"},
              {"RANK", "5"},
              {"WORLD_SIZE", "6"}};
  CHECK(dist_options::launcher().source == std::string("OMPI_COMM_WORLD_RANK"));
  CHECK(dist_options::from_env().role == role::scheduler);
  g.unset("OMPI_COMM_WORLD_RANK");
  CHECK(dist_options::launcher().source == std::string("PMI_RANK"));
  CHECK(dist_options::from_env().role == role::server);
  g.unset("PMI_SIZE");  // a rank without a size is no launcher
  CHECK(dist_options::launcher().source == std::string("PMIX_RANK"));
  CHECK(dist_options::from_env().rank_hint == 0);  // worker 0 of 2
  CHECK(dist_options::from_env().num_workers == 2);
  g.unset("PMIX_RANK");
  CHECK(dist_options::launcher().source == std::string("SLURM_PROCID"));
  CHECK(dist_options::from_env().rank_hint == 1);
  CHECK(dist_options::from_env().num_workers == 3);
  g.unset("SLURM_NTASKS");
  const auto l = dist_options::launcher();
  CHECK(l.source == std::string("RANK"));
  CHECK(l.rank == 5);
  CHECK(l.size == 6);
  CHECK(dist_options::from_env().rank_hint == 3);
  g.unset("RANK");
  CHECK(dist_options::launcher().source == nullptr);
  CHECK(dist_options::from_env().role == role::worker);
  CHECK(dist_options::from_env().rank_hint == -1);
}

TEST_CASE("a role given by KVSTORE_ROLE or DMLC_ROLE turns the launcher's rank off") {
  env_guard g{{"OMPI_COMM_WORLD_RANK", "0"},
              {"OMPI_COMM_WORLD_SIZE", "5"},
              {"MASTER_ADDR", "10.9.9.9"},
              {"KVSTORE_ROLE", "worker"}};
  auto o = dist_options::from_env();
  CHECK(o.role == role::worker);
  CHECK(o.num_workers == 1);
  CHECK(o.rank_hint == -1);
  CHECK(o.scheduler_host == "127.0.0.1");  // MASTER_ADDR is read only with a launcher's rank
  g.unset("KVSTORE_ROLE");
  g.set("DMLC_ROLE", "server");
  o = dist_options::from_env();
  CHECK(o.role == role::server);
  CHECK(o.rank_hint == -1);
}

TEST_CASE("KVSTORE_RANK is kept when no launcher gives a rank") {
  env_guard g{{"KVSTORE_ROLE", "server"}, {"KVSTORE_RANK", "3"}};
  CHECK(dist_options::from_env().rank_hint == 3);
}

TEST_CASE("the scheduler address under a launcher") {
  env_guard g{{"RANK", "2"}, {"WORLD_SIZE", "4"}};

  SUBCASE("torchrun: MASTER_ADDR and MASTER_PORT") {
    g.set("MASTER_ADDR", "10.0.0.1");
    g.set("MASTER_PORT", "29500");
    const auto o = dist_options::from_env();
    CHECK(o.scheduler_host == "10.0.0.1");
    CHECK(o.scheduler_port == 29500);
    CHECK(o.role == role::worker);
    CHECK(o.rank_hint == 0);
  }
  SUBCASE("MASTER_ADDR without MASTER_PORT keeps the default port") {
    g.set("MASTER_ADDR", "10.0.0.1");
    const auto o = dist_options::from_env();
    CHECK(o.scheduler_host == "10.0.0.1");
    CHECK(o.scheduler_port == 9091);
  }
  SUBCASE("MASTER_ADDR comes before the Slurm node list") {
    g.set("MASTER_ADDR", "10.0.0.1");
    g.set("SLURM_JOB_NODELIST", "node[01-04]");
    CHECK(dist_options::from_env().scheduler_host == "10.0.0.1");
  }
  SUBCASE("KVSTORE_SCHEDULER comes before MASTER_ADDR") {
    g.set("MASTER_ADDR", "10.0.0.1");
    g.set("MASTER_PORT", "29500");
    g.set("KVSTORE_SCHEDULER", "sched:7777");
    const auto o = dist_options::from_env();
    CHECK(o.scheduler_host == "sched");
    CHECK(o.scheduler_port == 7777);
  }
  SUBCASE("DMLC_PS_ROOT_URI comes before MASTER_ADDR") {
    g.set("MASTER_ADDR", "10.0.0.1");
    g.set("DMLC_PS_ROOT_URI", "10.0.0.2");
    g.set("DMLC_PS_ROOT_PORT", "9100");
    const auto o = dist_options::from_env();
    CHECK(o.scheduler_host == "10.0.0.2");
    CHECK(o.scheduler_port == 9100);
  }
  SUBCASE("DMLC_PS_ROOT_PORT alone gives the port; the host still comes from the node list") {
    g.set("SLURM_JOB_NODELIST", "gpu[7-8]");
    g.set("DMLC_PS_ROOT_PORT", "9100");
    const auto o = dist_options::from_env();
    CHECK(o.scheduler_host == "gpu7");
    CHECK(o.scheduler_port == 9100);
  }
}

TEST_CASE("the first host of a Slurm node list") {
  env_guard g{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}};
  const std::pair<const char*, const char*> cases[] = {
      {"localhost", "localhost"},
      {"node07", "node07"},
      {"a,b,c", "a"},
      {"node[03-05,7]", "node03"},
      {"node[7,9-10]", "node7"},
      {"node[03-05],login[1-2]", "node03"},
      {"gpu-[1-4]", "gpu-1"},
      {"n[1-2]-ib", "n1-ib"},
      {"rack[2-3]-n[01-04]", "rack2-n01"},
      {"10.0.0.4,10.0.0.5", "10.0.0.4"},
  };
  for (auto [list, first] : cases) {
    CAPTURE(list);
    g.set("SLURM_JOB_NODELIST", list);
    CHECK(dist_options::from_env().scheduler_host == std::string(first));
    CHECK(dist_options::from_env().scheduler_port == 9091);
  }
  SUBCASE("SLURM_NODELIST when SLURM_JOB_NODELIST is not set") {
    g.unset("SLURM_JOB_NODELIST");
    g.set("SLURM_NODELIST", "cn[100-200]");
    CHECK(dist_options::from_env().scheduler_host == "cn100");
  }
}

TEST_CASE("malformed values: kvstore::error naming the variable") {
  env_guard g;
  auto bad = [&](const char* var, const char* value) {
    const std::string setting = std::string(var) + "=" + value;
    CAPTURE(setting);
    g.set(var, value);
    check_error_names(var);
    g.unset(var);
  };
  bad("KVSTORE_ROLE", "boss");
  bad("DMLC_ROLE", "boss");
  bad("KVSTORE_SCHEDULER", "nohost");
  bad("KVSTORE_SCHEDULER", ":9091");
  bad("KVSTORE_SCHEDULER", "h:");
  bad("KVSTORE_SCHEDULER", "h:0");
  bad("KVSTORE_SCHEDULER", "h:65536");
  bad("KVSTORE_SCHEDULER", "h:90x");
  bad("DMLC_PS_ROOT_PORT", "http");
  bad("KVSTORE_NUM_WORKERS", "two");
  bad("KVSTORE_NUM_WORKERS", "0");
  bad("KVSTORE_NUM_SERVERS", "-1");
  bad("DMLC_NUM_WORKER", "x");
  bad("DMLC_NUM_SERVER", "0");
  bad("KVSTORE_TYPE", "local");
  bad("KVSTORE_RANK", "-2");
  bad("KVSTORE_ON_WORKER_DEATH", "retry");
  bad("KVSTORE_CHECKPOINT_INTERVAL_MS", "1s");
  bad("KVSTORE_CHECKPOINT_ROUNDS", "-1");
  bad("KVSTORE_SERVER_RESTART_WAIT_MS", "soon");
  bad("KVSTORE_CONNECT_TIMEOUT_MS", "0");
  bad("KVSTORE_HEARTBEAT_MS", "fast");

  // Launchers.
  g.set("OMPI_COMM_WORLD_SIZE", "4");
  bad("OMPI_COMM_WORLD_RANK", "first");
  g.unset("OMPI_COMM_WORLD_SIZE");
  g.set("RANK", "0");
  bad("WORLD_SIZE", "0");
  g.set("WORLD_SIZE", "4");
  g.set("MASTER_ADDR", "127.0.0.1");
  bad("MASTER_PORT", "port");
  g.unset("MASTER_ADDR");
  g.set("SLURM_PROCID", "0");
  g.set("SLURM_NTASKS", "4");
  bad("SLURM_JOB_NODELIST", "node[03-05");
  bad("SLURM_JOB_NODELIST", "node[]");
  bad("SLURM_JOB_NODELIST", ",node1");
}

TEST_CASE("a launcher's job too small, or sizes that disagree with it") {
  env_guard g{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  check_error_names("OMPI_COMM_WORLD_RANK");  // 2 processes: a scheduler, a server, no worker
  g.set("OMPI_COMM_WORLD_SIZE", "4");
  g.set("KVSTORE_NUM_SERVERS", "3");
  check_error_names("OMPI_COMM_WORLD_RANK");
  g.set("KVSTORE_NUM_SERVERS", "2");
  CHECK(dist_options::from_env().num_workers == 1);
  g.set("KVSTORE_NUM_WORKERS", "1");  // agrees with 4 - 1 - 2
  CHECK(dist_options::from_env().num_workers == 1);
  g.set("KVSTORE_NUM_WORKERS", "2");
  check_error_names("KVSTORE_NUM_WORKERS");
}

TEST_CASE("KVSTORE_STALENESS: a count of pushes or unbounded; negative or junk names it") {
  env_guard g;
  CHECK_FALSE(dist_options::from_env().staleness.has_value());  // default: unbounded
  g.set("KVSTORE_STALENESS", "0");
  CHECK(dist_options::from_env().staleness == std::optional<std::uint64_t>(0));
  g.set("KVSTORE_STALENESS", "3");
  CHECK(dist_options::from_env().staleness == std::optional<std::uint64_t>(3));
  g.set("KVSTORE_STALENESS", "unbounded");
  CHECK_FALSE(dist_options::from_env().staleness.has_value());
  for (const char* v :
       {"-1", "+1", " 1", "1.5", "two", "9223372036854775808", "99999999999999999999999"}) {
    CAPTURE(std::string(v));
    g.set("KVSTORE_STALENESS", v);
    check_error_names("KVSTORE_STALENESS");
  }
  g.unset("KVSTORE_STALENESS");
  g.set("KVSTORE_MAX_HELD_PULLS", "16");
  CHECK(dist_options::from_env().max_held_pulls == 16);
  g.set("KVSTORE_MAX_HELD_PULLS", "0");
  check_error_names("KVSTORE_MAX_HELD_PULLS");
  g.unset("KVSTORE_MAX_HELD_PULLS");
  g.set("KVSTORE_SERVER_THREADS", "3");
  CHECK(dist_options::from_env().server_threads == 3);
  g.set("KVSTORE_SERVER_THREADS", "0");  // the number of cores
  CHECK(dist_options::from_env().server_threads == 0);
  g.set("KVSTORE_SERVER_THREADS", "-2");
  check_error_names("KVSTORE_SERVER_THREADS");
  g.unset("KVSTORE_SERVER_THREADS");
  CHECK(dist_options::from_env().fuse_bytes == 65536);  // on by default
  CHECK(dist_options::from_env().fuse_time == std::chrono::microseconds(100));
  g.set("KVSTORE_FUSE_BYTES", "0");  // off
  CHECK(dist_options::from_env().fuse_bytes == 0);
  CHECK(dist_options::from_env().fuse_time == std::chrono::microseconds(100));
  g.set("KVSTORE_FUSE_BYTES", "65536");
  g.set("KVSTORE_FUSE_US", "250");
  CHECK(dist_options::from_env().fuse_bytes == 65536);
  CHECK(dist_options::from_env().fuse_time == std::chrono::microseconds(250));
  g.set("KVSTORE_FUSE_US", "soon");
  check_error_names("KVSTORE_FUSE_US");
}

TEST_CASE("dist_options::check_versions: a converted negative staleness names the option") {
  dist_options o;
  CHECK_NOTHROW(o.check_versions());
  o.staleness = 0;
  CHECK_NOTHROW(o.check_versions());
  o.staleness = static_cast<std::uint64_t>(-1);
  try {
    o.check_versions();
    FAIL("no error");
  } catch (const kvstore::error& e) {
    CHECK(e.code() == kvstore::make_error_code(kvstore::errc::invalid_argument));
    CHECK(std::string(e.what()).find("staleness") != std::string::npos);
  }
  o.staleness.reset();
  o.max_held_pulls = 0;
  CHECK_THROWS_AS(o.check_versions(), kvstore::error);
}

// ---- colocated servers (KVSTORE_COLOCATED) -------------------------------------------------

TEST_CASE(
    "KVSTORE_COLOCATED=1: one server in each worker; a server count that differs is an "
    "error naming both numbers") {
  env_guard g{{"KVSTORE_COLOCATED", "1"}, {"KVSTORE_NUM_WORKERS", "3"}};
  auto o = dist_options::from_env();
  CHECK(o.colocated);
  CHECK_FALSE(o.colocated_scheduler);
  CHECK(o.num_workers == 3);
  CHECK(o.num_servers == 3);
  g.set("KVSTORE_NUM_SERVERS", "3");  // the same count, given: fine
  CHECK(dist_options::from_env().num_servers == 3);
  for (const char* var : {"KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER"}) {
    CAPTURE(var);
    g.unset("KVSTORE_NUM_SERVERS");
    g.set(var, "2");
    try {
      (void)dist_options::from_env();
      FAIL("no error");
    } catch (const kvstore::error& e) {
      const std::string m = e.what();
      CHECK(e.code() == kvstore::make_error_code(kvstore::errc::invalid_argument));
      CHECK(m.find(var) != std::string::npos);
      CHECK(m.find("3 workers") != std::string::npos);
      CHECK(m.find("2 servers") != std::string::npos);
    }
    g.unset(var);
  }
  g.set("KVSTORE_COLOCATED", "0");
  g.set("KVSTORE_NUM_SERVERS", "2");
  o = dist_options::from_env();
  CHECK_FALSE(o.colocated);
  CHECK(o.num_servers == 2);
  g.set("KVSTORE_COLOCATED", "yes");
  check_error_names("KVSTORE_COLOCATED");
  // A server process has no place in a colocated job.
  g.set("KVSTORE_COLOCATED", "1");
  g.unset("KVSTORE_NUM_SERVERS");
  g.set("KVSTORE_ROLE", "server");
  check_error_names("colocated");
}

TEST_CASE("colocated under a launcher: every rank a worker, rank 0 also the scheduler") {
  env_guard g{{"KVSTORE_COLOCATED", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}};
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    g.set("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str());
    const auto o = dist_options::from_env();
    CHECK(o.role == role::worker);
    CHECK(o.rank_hint == rank);
    CHECK(o.num_workers == 3);
    CHECK(o.num_servers == 3);
    CHECK(o.colocated_scheduler == (rank == 0));
  }
  g.set("MASTER_ADDR", "10.1.2.3");  // where rank 0's scheduler listens
  g.set("MASTER_PORT", "7000");
  auto o = dist_options::from_env();
  CHECK(o.scheduler_host == "10.1.2.3");
  CHECK(o.scheduler_port == 7000);
  g.set("KVSTORE_NUM_WORKERS", "2");  // disagrees with the launcher's 3 processes
  check_error_names("KVSTORE_NUM_WORKERS");
  g.unset("KVSTORE_NUM_WORKERS");
  g.set("KVSTORE_NUM_SERVERS", "1");
  check_error_names("KVSTORE_NUM_SERVERS");
}

TEST_CASE(
    "resolve_colocated in code: num_servers at its default follows the workers; another "
    "count is an error naming both") {
  dist_options o;
  o.num_workers = 4;
  o.resolve_colocated();  // not colocated: nothing changes
  CHECK(o.num_servers == 1);
  o.colocated = true;
  o.resolve_colocated();
  CHECK(o.num_servers == 4);
  o.num_servers = 2;
  try {
    o.resolve_colocated();
    FAIL("no error");
  } catch (const kvstore::error& e) {
    const std::string m = e.what();
    CHECK(m.find("4 workers") != std::string::npos);
    CHECK(m.find("is 2") != std::string::npos);
  }
}
