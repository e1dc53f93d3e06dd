// The distinct rows of a pull_rows request and where each goes in the caller's output. A server
// answers every row it is asked for once (it refuses a row named twice, so an answer is never
// bigger than its slice); the worker copies a row to every place the caller named it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvstore::detail {

struct row_fanout {
  std::vector<std::int64_t> ids;       ///< distinct rows, in order of first mention
  std::vector<std::size_t> first;      ///< positions of ids[d]: positions[first[d], first[d+1])
  std::vector<std::size_t> positions;  ///< indexes into the caller's row list

  /// The rows of `rows` that `keep` selects, grouped by id.
  template <class Keep>
  static row_fanout of(std::span<const std::int64_t> rows, Keep keep) {
    row_fanout f;
    std::unordered_map<std::int64_t, std::size_t> index;
    std::vector<std::size_t> distinct_of;  // for each kept position, its id's index
    std::vector<std::size_t> kept;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (!keep(rows[i])) continue;
      auto [it, fresh] = index.try_emplace(rows[i], f.ids.size());
      if (fresh) f.ids.push_back(rows[i]);
      distinct_of.push_back(it->second);
      kept.push_back(i);
    }
    // Counting sort of the kept positions by their id's index.
    f.first.assign(f.ids.size() + 1, 0);
    for (auto d : distinct_of) ++f.first[d + 1];
    for (std::size_t d = 0; d < f.ids.size(); ++d) f.first[d + 1] += f.first[d];
    f.positions.resize(kept.size());
    std::vector<std::size_t> next(f.first.begin(), f.first.end() - 1);
    for (std::size_t j = 0; j < kept.size(); ++j) f.positions[next[distinct_of[j]]++] = kept[j];
    return f;
  }
};

}  // namespace kvstore::detail
