#include <kvstore/optim/state_file.hpp>  // first: the header is self-contained

#include <kvstore/detail/atomic_file.hpp>

#include <doctest/doctest.h>

#include "support/helpers.hpp"

using kvtest::error_of;

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
namespace optim = kvstore::optim;
using kvstore::errc;

namespace {

/// A fresh directory per test case, removed afterwards.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() /
           ("kvstore_test_state_file_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

bool mentions(const kvstore::error& e, const fs::path& p) {
  return std::string(e.what()).find(p.string()) != std::string::npos;
}

template <class T>
std::map<std::uint64_t, optim::key_state<T>> sample_states() {
  std::map<std::uint64_t, optim::key_state<T>> m;
  const kvstore::key named("fc1.w");
  m[3] = {"", {5, {{T(0.5), T(-1.25), T(3)}, {T(1e-3), T(2), T(0)}}}};
  m[named.id()] = {"fc1.w", {1, {{T(7)}, {T(8)}}}};
  m[0] = {"", {0, {}}};  // a key never updated yet
  std::vector<T> big(1000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<T>(i) / 7;
  m[static_cast<std::uint64_t>(-5)] = {"", {42, {big, big}}};
  return m;
}

template <class T>
void check_equal(const std::map<std::uint64_t, optim::key_state<T>>& a,
                 const std::map<std::uint64_t, optim::key_state<T>>& b) {
  REQUIRE(a.size() == b.size());
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    CHECK(ia->first == ib->first);
    CHECK(ia->second.name == ib->second.name);
    CHECK(ia->second.st.step == ib->second.st.step);
    CHECK(ia->second.st.slots == ib->second.st.slots);
  }
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE_TEMPLATE("save then load gives the same states" * doctest::timeout(60), T, float,
                   double) {
  temp_dir d;
  const auto p = d.path / "opt.states";
  const auto m = sample_states<T>();
  optim::save_states<T>(p, "adam", m);
  check_equal(optim::load_states<T>(p, "adam"), m);
  // Saving again replaces the file whole.
  auto m2 = m;
  m2.erase(3);
  m2[9] = {"", {2, {{T(1), T(2)}}}};
  optim::save_states<T>(p, "adam", m2);
  check_equal(optim::load_states<T>(p, "adam"), m2);
  // An empty store round-trips too.
  optim::save_states<T>(p, "sgd", {});
  CHECK(optim::load_states<T>(p, "sgd").empty());
  // And nothing but the file is left in the directory.
  CHECK(d.entries() == std::vector<std::string>{"opt.states"});
}

TEST_CASE("a file that is not a state file is refused" * doctest::timeout(60)) {
  temp_dir d;
  const auto p = d.path / "x";
  optim::save_states<float>(p, "sgd", sample_states<float>());
  std::string bytes = kvstore::detail::read_file(p);
  bytes[0] = 'X';
  write_raw(p, bytes);
  auto e = error_of([&] { (void)optim::load_states<float>(p, "sgd"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
  CHECK(mentions(*e, p));
  CHECK(std::string(e->what()).find("magic") != std::string::npos);

  write_raw(p, "hello, world, this is just text and not a state file");
  e = error_of([&] { (void)optim::load_states<float>(p, "sgd"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
}

TEST_CASE("a huge file that is not a state file is refused before it is read" *
          doctest::timeout(20)) {
  // 1 TiB, sparse: reading it whole (as the loader once did before checking the magic) would
  // take hours or fail to allocate; the magic is checked after 8 bytes.
  temp_dir d;
  const auto p = d.path / "huge";
  { std::ofstream(p) << "NOTSTATE"; }
  fs::resize_file(p, std::uintmax_t{1} << 40);
  auto e = error_of([&] { (void)optim::load_states<float>(p, "sgd"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
  CHECK(std::string(e->what()).find("magic") != std::string::npos);
}

TEST_CASE("a truncated file is refused at every length" * doctest::timeout(60)) {
  temp_dir d;
  const auto src = d.path / "good";
  const auto p = d.path / "cut";
  optim::save_states<double>(src, "adagrad", sample_states<double>());
  const std::string bytes = kvstore::detail::read_file(src);
  REQUIRE(bytes.size() > 100);
  std::vector<std::size_t> lengths{
      0, 1, 7, 8, 11, 12, 16, 19, 20, 27, 35, 40, bytes.size() / 2, bytes.size() - 1};
  for (std::size_t n = 0; n < 64; ++n) lengths.push_back(n);
  for (std::size_t n : lengths) {
    CAPTURE(n);
    write_raw(p, bytes.substr(0, n));
    const auto e = error_of([&] { (void)optim::load_states<double>(p, "adagrad"); });
    REQUIRE(e);
    CHECK(e->code() == errc::bad_file);
    CHECK(mentions(*e, p));
  }
  // Extra bytes after the payload are refused as well.
  write_raw(p, bytes + "x");
  const auto e = error_of([&] { (void)optim::load_states<double>(p, "adagrad"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
}

TEST_CASE("any single flipped byte is detected" * doctest::timeout(60)) {
  temp_dir d;
  const auto src = d.path / "good";
  const auto p = d.path / "flipped";
  std::map<std::uint64_t, optim::key_state<float>> m;
  m[1] = {"", {3, {{1.f, 2.f, 3.f}}}};
  m[kvstore::key("emb").id()] = {"emb", {1, {{4.f, 5.f}}}};
  optim::save_states<float>(src, "sgd", m);
  const std::string bytes = kvstore::detail::read_file(src);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    CAPTURE(i);
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x10);
    write_raw(p, b);
    const auto e = error_of([&] { (void)optim::load_states<float>(p, "sgd"); });
    REQUIRE(e);
    CHECK(e->code() == errc::bad_file);
    CHECK(mentions(*e, p));
  }
}

TEST_CASE("a file of another optimizer or element type is refused" * doctest::timeout(60)) {
  temp_dir d;
  const auto p = d.path / "s";
  optim::save_states<float>(p, "adam", sample_states<float>());
  auto e = error_of([&] { (void)optim::load_states<float>(p, "sgd"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
  CHECK(mentions(*e, p));
  CHECK(std::string(e->what()).find("\"adam\"") != std::string::npos);
  CHECK(std::string(e->what()).find("\"sgd\"") != std::string::npos);

  e = error_of([&] { (void)optim::load_states<double>(p, "adam"); });
  REQUIRE(e);
  CHECK(e->code() == errc::bad_file);
  CHECK(mentions(*e, p));
  CHECK(std::string(e->what()).find("element type") != std::string::npos);
}

TEST_CASE("a failed load leaves the caller's states as they were" * doctest::timeout(60)) {
  temp_dir d;
  const auto p = d.path / "s";
  optim::save_states<double>(p, "adam", sample_states<double>());
  auto mine = sample_states<double>();
  mine.erase(3);
  const auto before = mine;
  CHECK_THROWS_AS(mine = optim::load_states<double>(p, "sgd"), kvstore::error);
  check_equal(mine, before);
}

TEST_CASE("missing files and directories are io errors naming the path" * doctest::timeout(60)) {
  temp_dir d;
  const auto missing = d.path / "no_such_file";
  auto e = error_of([&] { (void)optim::load_states<float>(missing, "sgd"); });
  REQUIRE(e);
  CHECK(e->code() == errc::io_error);
  CHECK(mentions(*e, missing));

  const auto in_missing_dir = d.path / "no_such_dir" / "f";
  e = error_of([&] { optim::save_states<float>(in_missing_dir, "sgd", sample_states<float>()); });
  REQUIRE(e);
  CHECK(e->code() == errc::io_error);
  CHECK(mentions(*e, in_missing_dir));
  CHECK(d.entries().empty());

  e = error_of([&] { (void)kvstore::detail::read_file(d.path); });
  REQUIRE(e);
  CHECK(e->code() == errc::io_error);
}

TEST_CASE("write_file_atomically and read_file" * doctest::timeout(60)) {
  temp_dir d;
  const auto p = d.path / "blob";
  const std::string bytes("a\0b\xff\n", 5);
  kvstore::detail::write_file_atomically(p, bytes);
  CHECK(kvstore::detail::read_file(p) == bytes);
  const std::byte raw[] = {std::byte{1}, std::byte{0}, std::byte{2}};
  kvstore::detail::write_file_atomically(p, std::span<const std::byte>(raw));
  CHECK(kvstore::detail::read_file(p) == std::string("\x01\x00\x02", 3));
  kvstore::detail::write_file_atomically(p, std::string_view{});
  CHECK(kvstore::detail::read_file(p).empty());
  CHECK(d.entries() == std::vector<std::string>{"blob"});

  // A relative path writes into the current directory.
  const auto cwd = fs::current_path();
  fs::current_path(d.path);
  kvstore::detail::write_file_atomically("rel", "x");
  fs::current_path(cwd);
  CHECK(kvstore::detail::read_file(d.path / "rel") == "x");
}

TEST_CASE("checksum is the standard CRC-32" * doctest::timeout(60)) {
  CHECK(kvstore::detail::checksum("123456789") == 0xCBF43926u);
  CHECK(kvstore::detail::checksum(std::string_view{}) == 0u);
  const std::byte b[] = {std::byte{'1'}, std::byte{'2'}, std::byte{'3'},
                         std::byte{'4'}, std::byte{'5'}, std::byte{'6'},
                         std::byte{'7'}, std::byte{'8'}, std::byte{'9'}};
  CHECK(kvstore::detail::checksum(std::span<const std::byte>(b)) == 0xCBF43926u);
}
