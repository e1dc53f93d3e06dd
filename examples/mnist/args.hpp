// train_mnist's command line: every flag with its default in one struct (`args`), the usage
// text, and the parser. A new flag is a field, a usage line and an `else if` in parse_args.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace mnist {

struct args {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  std::size_t batch = 128;  // global: summed over all workers
  double lr = 0.02;
  double momentum = 0.9;
  double weight_decay = 0;
  std::size_t limit = 0;  // 0 = every training sample
  double target = -1;     // < 0: no check
  unsigned threads = 0;   // compute threads per worker; 0 = cores / workers
  bool local = false;
  int devices = 0;  // > 0: DataParallelTable over KVStore<device> with this many devices
  std::vector<std::size_t> hidden = {256, 128};
  std::uint32_t seed = 42;
};

inline const char* const usage =
    "usage: train_mnist [--local] [options]\n"
    "  --local          train with KVStore<local> in this process (else: dist, via kv_launch)\n"
    "  --devices N      train data-parallel over N devices with DataParallelTable (device build)\n"
    "  --data DIR       Fashion-MNIST IDX files, plain or .gz (/usr/share/datasets/fashion-mnist)\n"
    "  --epochs N       passes over the training set (3)\n"
    "  --batch B        global mini-batch, split evenly over the workers (128)\n"
    "  --lr X           learning rate of SGD (0.02)\n"
    "  --momentum X     momentum of SGD (0.9)\n"
    "  --wd X           weight decay (0)\n"
    "  --hidden A,B,..  hidden layer sizes (256,128)\n"
    "  --limit N        use only the first N training samples (all)\n"
    "  --threads T      compute threads per worker (cores / workers)\n"
    "  --seed S         seed of the initial weights and the shuffles (42)\n"
    "  --target ACC     exit 1 if the final test accuracy is below ACC (0..1)\n";

namespace detail {

[[noreturn]] inline void die(const std::string& msg) {
  std::cerr << "train_mnist: " << msg << "\n" << usage;
  std::exit(2);
}

template <class N>
N parse_number(const std::string& flag, const std::string& s) {
  std::istringstream in(s);
  N v{};
  if (!(in >> v) || !in.eof()) die("bad value '" + s + "' for " + flag);
  return v;
}

}  // namespace detail

/// The flags; --help prints the usage and exits 0, a bad flag prints it and exits 2.
inline args parse_args(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) detail::die("missing value for " + flag);
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (flag == "--local") {
      a.local = true;
    } else if (flag == "--devices") {
      a.devices = detail::parse_number<int>(flag, next());
    } else if (flag == "--data") {
      a.data_dir = next();
    } else if (flag == "--epochs") {
      a.epochs = detail::parse_number<int>(flag, next());
    } else if (flag == "--batch") {
      a.batch = detail::parse_number<std::size_t>(flag, next());
    } else if (flag == "--lr") {
      a.lr = detail::parse_number<double>(flag, next());
    } else if (flag == "--momentum") {
      a.momentum = detail::parse_number<double>(flag, next());
    } else if (flag == "--wd") {
      a.weight_decay = detail::parse_number<double>(flag, next());
    } else if (flag == "--limit") {
      a.limit = detail::parse_number<std::size_t>(flag, next());
    } else if (flag == "--threads") {
      a.threads = detail::parse_number<unsigned>(flag, next());
    } else if (flag == "--seed") {
      a.seed = detail::parse_number<std::uint32_t>(flag, next());
    } else if (flag == "--target") {
      a.target = detail::parse_number<double>(flag, next());
    } else if (flag == "--hidden") {
      a.hidden.clear();
      std::istringstream in(next());
      for (std::string part; std::getline(in, part, ',');) {
        a.hidden.push_back(detail::parse_number<std::size_t>(flag, part));
      }
    } else {
      detail::die("unknown option " + flag);
    }
  }
  if (a.epochs < 1) detail::die("--epochs must be at least 1");
  if (a.batch < 1) detail::die("--batch must be at least 1");
  if (!(a.lr > 0)) detail::die("--lr must be positive");
  for (std::size_t h : a.hidden)
    if (h == 0) detail::die("--hidden sizes must be positive");
  return a;
}

}  // namespace mnist
