// Reader of the IDX files that (Fashion-)MNIST ships in, plain or gzipped.
//
// zlib's gzread reads a plain file transparently, so one code path serves both `foo` and
// `foo.gz`. Every failure names the file and what is wrong (missing, bad magic, truncated), since
// a trainer that dies on a half-downloaded data set should say so rather than train on zeros.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace mnist {

/// The contents of one IDX file of unsigned bytes: its dimensions and its elements, row-major.
struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;

  /// Elements per item (product of all dimensions but the first).
  std::size_t item_size() const {
    std::size_t n = 1;
    for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
    return n;
  }
  std::size_t items() const { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {

class gz_file {
 public:
  explicit gz_file(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (f_ == nullptr) throw std::runtime_error("idx: cannot open " + path);
    // A bigger buffer than zlib's 8 KiB default: the training images are 47 MB unpacked.
    gzbuffer(f_, 1 << 18);
  }
  gz_file(const gz_file&) = delete;
  gz_file& operator=(const gz_file&) = delete;
  ~gz_file() { gzclose(f_); }

  /// Reads exactly n bytes or throws, naming what was being read.
  void read_exact(void* out, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t got = 0;
    while (got < n) {
      // gzread takes an unsigned count; read in pieces so huge files are fine too.
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      const int r = gzread(f_, p + got, chunk);
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        throw std::runtime_error("idx: " + path_ + ": read error in " + what + ": " +
                                 (msg ? msg : "unknown"));
      }
      if (r == 0) {
        throw std::runtime_error("idx: " + path_ + ": truncated: " + what + " needs " +
                                 std::to_string(n) + " bytes, file ends after " +
                                 std::to_string(got));
      }
      got += static_cast<std::size_t>(r);
    }
  }

 private:
  std::string path_;
  gzFile f_;
};

inline std::uint32_t be32(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

}  // namespace detail

/// Reads an IDX file of unsigned bytes (type code 0x08) with `expected_rank` dimensions.
inline idx_array read_idx(const std::string& path, std::size_t expected_rank) {
  detail::gz_file f(path);
  std::array<unsigned char, 4> magic{};
  f.read_exact(magic.data(), magic.size(), "the magic number");
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (magic[0] != 0 || magic[1] != 0) {
    throw std::runtime_error(
        "idx: " + path + ": bad magic (not an IDX file" +
        std::string(magic[0] == 0x1f && magic[1] == 0x8b ? ", looks gzipped twice" : "") + ")");
  }
  if (magic[2] != 0x08) {
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", magic[2]);
    throw std::runtime_error("idx: " + path + ": element type " + code +
                             " is not unsigned byte (0x08)");
  }
  if (magic[3] != expected_rank) {
    throw std::runtime_error("idx: " + path + ": has " + std::to_string(magic[3]) +
                             " dimensions, expected " + std::to_string(expected_rank));
  }
  idx_array a;
  std::size_t total = 1;
  for (std::size_t i = 0; i < expected_rank; ++i) {
    std::array<unsigned char, 4> b{};
    f.read_exact(b.data(), b.size(), "the dimensions");
    a.dims.push_back(detail::be32(b.data()));
    total *= a.dims.back();
    // 2^32 bytes is far beyond any MNIST-like file: reject before allocating.
    if (total > (std::size_t{1} << 32)) {
      throw std::runtime_error("idx: " + path + ": dimensions too large");
    }
  }
  a.data.resize(total);
  f.read_exact(a.data.data(), total, "the data");
  return a;
}

/// A data set: images as floats (standardized), one label per image.
struct dataset {
  std::size_t rows = 0;
  std::size_t cols = 0;  // pixels per image
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
  std::size_t size() const { return labels.size(); }
};

/// `dir/name` if it exists, else `dir/name.gz`, else an error naming both.
inline std::string find_file(const std::filesystem::path& dir, const std::string& name) {
  const auto plain = dir / name;
  if (std::filesystem::exists(plain)) return plain.string();
  const auto gz = dir / (name + ".gz");
  if (std::filesystem::exists(gz)) return gz.string();
  throw std::runtime_error("mnist: neither " + plain.string() + " nor " + gz.string() +
                           " exists (install the Debian package dataset-fashion-mnist, or pass "
                           "--data DIR)");
}

/// Loads `<prefix>-images-idx3-ubyte` and `<prefix>-labels-idx1-ubyte` from dir ("train" or
/// "t10k"); keeps only the first `limit` items when limit > 0. Pixels are left in [0, 1];
/// standardize() does the rest once the training statistics are known.
inline dataset load(const std::filesystem::path& dir, const std::string& prefix,
                    std::size_t limit = 0) {
  const auto img_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const auto lbl_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const idx_array img = read_idx(img_path, 3);
  const idx_array lbl = read_idx(lbl_path, 1);
  if (img.items() != lbl.items()) {
    throw std::runtime_error("mnist: " + img_path + " has " + std::to_string(img.items()) +
                             " images but " + lbl_path + " has " + std::to_string(lbl.items()) +
                             " labels");
  }
  dataset d;
  const std::size_t n = limit > 0 ? std::min<std::size_t>(limit, img.items()) : img.items();
  d.rows = n;
  d.cols = img.item_size();
  d.images.resize(n * d.cols);
  for (std::size_t i = 0; i < n * d.cols; ++i) d.images[i] = img.data[i] * (1.0f / 255.0f);
  d.labels.assign(lbl.data.begin(), lbl.data.begin() + static_cast<std::ptrdiff_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    if (d.labels[i] > 9) {
      throw std::runtime_error("mnist: " + lbl_path + ": label " + std::to_string(d.labels[i]) +
                               " of item " + std::to_string(i) + " is not in 0..9");
    }
  }
  return d;
}

/// Mean and standard deviation of all pixels: zero-mean, unit-variance inputs let plain SGD use
/// one learning rate for every layer.
struct pixel_stats {
  float mean = 0;
  float stddev = 1;
};

inline pixel_stats stats_of(const dataset& d) {
  double s = 0;
  double s2 = 0;
  for (float v : d.images) {
    s += v;
    s2 += double{v} * v;
  }
  const double n = static_cast<double>(std::max<std::size_t>(d.images.size(), 1));
  const double mean = s / n;
  const double var = std::max(s2 / n - mean * mean, 1e-12);
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(var))};
}

inline void standardize(dataset& d, pixel_stats st) {
  const float inv = 1.0f / st.stddev;
  for (float& v : d.images) v = (v - st.mean) * inv;
}

}  // namespace mnist
