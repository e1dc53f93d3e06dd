// Command-line pieces shared by the tools (kv_server, kv_launch) on top of Boost.Program_options,
// which does the parsing, the types and --help: here only a value with a range.
#pragma once

#include <boost/program_options.hpp>

#include <sstream>
#include <string>
#include <vector>

namespace kvtool {

namespace po = boost::program_options;

/// A typed value that must lie in [lo, hi]. Out of range (NaN included) is a po::error that names
/// the option, the value and the range, like the library's own "is invalid" for a wrong type.
template <class T>
class ranged_value : public po::typed_value<T> {
 public:
  ranged_value(T* store, T lo, T hi) : po::typed_value<T>(store), lo_(lo), hi_(hi) {}

  void xparse(boost::any& out, const std::vector<std::string>& tokens) const override {
    po::typed_value<T>::xparse(out, tokens);
    const T v = boost::any_cast<T>(out);
    if (v >= lo_ && v <= hi_) return;
    std::ostringstream range;
    range << lo_ << " to " << hi_;
    // The parser fills in the option's name as the user wrote it (--port, -p).
    po::error_with_option_name e(
        "the argument ('%value%') for option '%canonical_option%' is out of range: "
        "it must be from " +
        range.str());
    e.set_substitute("value", tokens.empty() ? std::string() : tokens.front());
    throw e;
  }

 private:
  T lo_, hi_;
};

/// po::value(store) limited to [lo, hi]: `("port,p", kvtool::ranged(&port, 0, 65535), "...")`.
template <class T>
ranged_value<T>* ranged(T* store, T lo, T hi) {
  return new ranged_value<T>(store, lo, hi);  // owned by the options_description, as po::value's
}

}  // namespace kvtool
