// TLS: every connection inside asio::ssl with certificates from a throwaway CA (made here with
// the openssl command), peers verified on both sides; the token handshake runs inside it.
#include <kvstore/transport/tls.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/process.hpp"

#include <cstdlib>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

struct pki {
  kvtest::temp_dir dir{"kvstore-tls"};
  pki() {
    // Two CAs: ours signs the nodes; a stranger's signs an intruder.
    for (const char* ca : {"ca", "other-ca"}) {
      run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "
          "/CN=" +
          std::string(ca) + " -keyout " + p(std::string(ca) + ".key") + " -out " +
          p(std::string(ca) + ".pem"));
    }
    issue("node", "ca");
    issue("intruder", "other-ca");
  }
  std::string p(const std::string& f) const { return dir / f; }
  void issue(const std::string& name, const std::string& ca) {
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + name +
        " -keyout " + p(name + ".key") + " -out " + p(name + ".csr"));
    run("openssl x509 -req -days 1 -in " + p(name + ".csr") + " -CA " + p(ca + ".pem") +
        " -CAkey " + p(ca + ".key") + " -CAcreateserial -out " + p(name + ".pem"));
  }
  static void run(const std::string& cmd) {
    REQUIRE_MESSAGE(std::system((cmd + " >/dev/null 2>&1").c_str()) == 0, cmd);
  }
  void use(kvstore::dist_options& o, const std::string& who, const std::string& ca = "ca") const {
    o.tls_cert = p(who + ".pem");
    o.tls_key = p(who + ".key");
    o.tls_ca = p(ca + ".pem");
  }
};

}  // namespace

TEST_CASE("a job over TLS trains; strangers are refused" * doctest::timeout(90)) {
  pki keys;
  auto o = kvtest::test_options(2, 2);
  o.token = "s3cret";
  o.bind_host = "127.0.0.1";
  o.handshake_timeout = 3'000ms;
  keys.use(o, "node");
  kvtest::cluster c(o);
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> v(300'000), out(v.size());  // sliced over both servers
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97);
    kv.init("w", v);
    kv.push("w", v).wait();
    kv.pull("w", out).wait();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < v.size(); ++i) wrong += out[i] != 2 * v[i];
    CHECK(wrong == 0);
  });

  using store = kvstore::KVStore<kvstore::dist>;
  {  // a certificate from another CA
    auto bad = c.options();
    keys.use(bad, "intruder");
    bad.connect_timeout = 3'000ms;
    CHECK_THROWS_AS(store{bad}, kvstore::error);
  }
  {  // no TLS at all
    auto bad = c.options();
    bad.tls_cert.clear();
    bad.connect_timeout = 3'000ms;
    CHECK_THROWS_AS(store{bad}, kvstore::error);
  }
  {  // a missing key file is a clear error at once
    auto bad = c.options();
    bad.tls_key = keys.p("nope.key");
    CHECK_THROWS_WITH_AS(store{bad}, doctest::Contains("nope.key"), kvstore::error);
  }
}
