// multiverso_tables: Multiverso's array and matrix table test (the checks of its Torch binding's
// test suite) written against kvstore's Multiverso layer. Every worker adds to an array table
// and a matrix table, meets the others at a barrier and checks every value exactly.
//
//   kv_launch -w 2 -s 1 --type dist_async -- multiverso_tables
//   KVSTORE_STALENESS=0 kv_launch -w 2 -s 1 --type dist_async -- multiverso_tables --sync
//   multiverso_tables --local                  one process, no servers
//
// Exit codes: 0 every value right, 1 a wrong value, 2 a kvstore error or bad arguments.
#include <kvstore/compat/multiverso.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace mv = kvstore::compat::multiverso;

namespace {

constexpr int iterations = 10;

bool wrong(const char* what, int it, std::size_t at, float got, double want) {
  std::printf(
      "multiverso_tables worker %d: wrong value: %s, iteration %d, element %zu is %g, "
      "expected %g\n",
      mv::worker_id(), what, it, at, static_cast<double>(got), want);
  return true;
}

// ArrayTableHandler: every iteration each worker adds 1..size twice; after iteration i each
// element j holds (j + 1) * i * workers * 2.
bool array_table_fails(std::size_t& checked) {
  const std::size_t size = 100000;
  const int workers = mv::num_workers();
  mv::ArrayTableHandler table(size);
  std::vector<float> delta(size);
  for (std::size_t j = 0; j < size; ++j) delta[j] = static_cast<float>(j + 1);
  mv::barrier();
  for (int i = 1; i <= iterations; ++i) {
    table.add(delta);
    table.add(delta);
    mv::barrier();
    const std::vector<float> got = table.get();
    mv::barrier();  // everyone has read before anyone adds again
    for (std::size_t j = 0; j < size; ++j) {
      const double want = static_cast<double>(j + 1) * i * workers * 2;
      if (got[j] != want) return wrong("array table", i, j, got[j], want);
    }
    checked += size;
  }
  return false;
}

// MatrixTableHandler, 11 x 10: every iteration each worker adds the whole table (element
// r * cols + c gets r * cols + c + 1) and then rows {0, 1, 5, 10} again with their own values;
// after iteration i an element holds its value * i * workers, twice that in the rows added twice.
bool matrix_table_fails(std::size_t& checked) {
  const std::size_t rows = 11, cols = 10;
  const int workers = mv::num_workers();
  const std::vector<std::int64_t> row_ids{0, 1, 5, 10};
  mv::MatrixTableHandler table(rows, cols);
  std::vector<float> whole(rows * cols), some;
  for (std::size_t e = 0; e < whole.size(); ++e) whole[e] = static_cast<float>(e + 1);
  for (std::int64_t r : row_ids)
    for (std::size_t c = 0; c < cols; ++c)
      some.push_back(static_cast<float>(static_cast<std::size_t>(r) * cols + c + 1));
  auto twice = [&](std::size_t r) {
    for (std::int64_t x : row_ids)
      if (static_cast<std::size_t>(x) == r) return true;
    return false;
  };
  mv::barrier();
  for (int i = 1; i <= iterations; ++i) {
    table.add(whole);
    table.add(some, row_ids);
    mv::barrier();
    const std::vector<float> got_rows = table.get(row_ids);
    const std::vector<float> got = table.get();
    mv::barrier();
    for (std::size_t k = 0; k < row_ids.size(); ++k)
      for (std::size_t c = 0; c < cols; ++c) {
        const std::size_t e = static_cast<std::size_t>(row_ids[k]) * cols + c;
        const double want = static_cast<double>(e + 1) * i * workers * 2;
        if (got_rows[k * cols + c] != want)
          return wrong("matrix table get(row_ids)", i, e, got_rows[k * cols + c], want);
      }
    for (std::size_t e = 0; e < rows * cols; ++e) {
      const double want = static_cast<double>(e + 1) * i * workers * (twice(e / cols) ? 2 : 1);
      if (got[e] != want) return wrong("matrix table get()", i, e, got[e], want);
    }
    checked += got_rows.size() + got.size();
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  mv::options o;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--sync") {
      o.sync = true;
    } else if (arg == "--local") {
      o.store = mv::store_kind::local;
    } else {
      std::fprintf(stderr, "usage: multiverso_tables [--sync] [--local]\n");
      return 2;
    }
  }
  try {
    mv::init(o);  // launched SPMD (mpirun), a server or scheduler process serves here instead
    const int id = mv::worker_id();
    std::printf("multiverso_tables worker %d of %d, %s\n", id, mv::num_workers(),
                o.sync ? "-sync" : "async");
    std::size_t checked = 0;
    if (array_table_fails(checked) || matrix_table_fails(checked)) {
      mv::shutdown();
      return 1;
    }
    mv::shutdown();
    std::printf("multiverso_tables worker %d ok: %zu values checked\n", id, checked);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multiverso_tables: %s\n", e.what());
    return 2;
  }
}
