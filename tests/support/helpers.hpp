// Small helpers shared by the tests. Include after <doctest/doctest.h>.
#pragma once

#include <kvstore/error.hpp>

#include <atomic>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace doctest {
// A vector of numbers in a failed check: its first 16 elements and its size.
template <class T>
requires std::is_arithmetic_v<T>
struct StringMaker<std::vector<T>> {
  static String convert(const std::vector<T>& v) {
    std::string s = "{";
    for (std::size_t i = 0; i < v.size() && i < 16; ++i)
      s += (i ? ", " : "") + std::to_string(v[i]);
    if (v.size() > 16) s += ", ... (" + std::to_string(v.size()) + ")";
    return (s + "}").c_str();
  }
};
}  // namespace doctest

namespace kvtest {

template <class T = float>
std::vector<T> filled(std::size_t n, T v) {
  return std::vector<T>(n, v);
}

template <class T = float>
std::vector<T> iota(std::size_t n, T start, T step = 1) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<T>(i);
  return v;
}

// Runs f, which must throw kvstore::error with `code` and a message containing every part.
template <class F>
void expect_error(F&& f, kvstore::errc code, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL("no exception; expected one containing " << *parts.begin());
  } catch (const kvstore::error& e) {
    CHECK_MESSAGE(e.code() == make_error_code(code), e.what());
    for (auto& p : parts)
      CHECK_MESSAGE(std::string(e.what()).find(p) != std::string::npos, e.what() << " lacks " << p);
  }
}

// Joins a helper thread (a killer, an attacker) when the test leaves its scope, also by an
// exception: first stores `release` into the flag the thread polls, so it stops waiting.
template <class T>
struct join_on_exit {
  std::thread& t;
  std::atomic<T>& flag;
  T release;
  ~join_on_exit() {
    flag = release;
    if (t.joinable()) t.join();
  }
};

// The kvstore::error f throws, if any.
template <class F>
std::optional<kvstore::error> error_of(F&& f) {
  try {
    f();
  } catch (const kvstore::error& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace kvtest
