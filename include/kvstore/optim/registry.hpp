// The process-wide optimizer registry: name -> factory. An optimizer leaves a process only as
// (registered name, serialized parameters); the receiving process rebuilds it from this registry,
// so servers run code compiled into them, never code sent to them.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/optim/adagrad.hpp>
#include <kvstore/optim/adam.hpp>
#include <kvstore/optim/add.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/sgd.hpp>

#include <boost/archive/archive_exception.hpp>
#include <boost/archive/text_iarchive.hpp>
#include <boost/archive/text_oarchive.hpp>

#include <exception>
#include <locale>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>

namespace kvstore::optim {

/// Refuses parameters no update could use: today a bad learning-rate schedule (kvstore::error
/// with errc::invalid_argument naming the field). Every optimizer passes here on its way to a
/// store (serialize_params) and again where it is rebuilt (deserialize_params).
template <registered_optimizer O>
void check_params(const O& o) {
  if constexpr (requires { o.schedule.check(); }) {
    try {
      o.schedule.check();
    } catch (const error& e) {
      throw error(errc::invalid_argument, std::string(O::name) + ": " + e.what());
    }
  }
}

/// The parameters of `o` as a text archive (no archive header), what travels with the name.
/// Throws what check_params throws.
template <registered_optimizer O>
std::string serialize_params(const O& o) {
  check_params(o);
  std::ostringstream os;
  // The classic locale on both ends: a worker whose global locale writes "0,5" must still be
  // understood by a server that reads "0.5".
  os.imbue(std::locale::classic());
  {
    boost::archive::text_oarchive oa(os, boost::archive::no_header);
    oa << o;
  }
  return std::move(os).str();
}

/// An updater applying `o` to elements of type T (float or double). It carries `O::name` and the
/// serialized parameters, so it can be rebuilt elsewhere with create_updater (once O is
/// registered there). Throws whatever serializing the parameters throws (nothing for the
/// built-in optimizers).
template <class T, registered_optimizer O>
updater<T> make_updater(const O& o) {
  updater<T> u;
  u.name = std::string(O::name);
  u.params = serialize_params(o);
  u.num_slots = O::num_slots;
  u.elementwise = is_elementwise<O>;
  u.fn = [o](const key&, std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) {
    o.update(grad, weight, s);
  };
  return u;
}

}  // namespace kvstore::optim

namespace kvstore::detail {

/// The parameters of an O from serialize_params' text. Throws kvstore::error(invalid_argument)
/// when the text is not a valid archive of O's parameters.
template <optim::registered_optimizer O>
O deserialize_params(std::string_view name, std::string_view params) {
  O o{};
  try {
    std::istringstream is{std::string(params)};
    is.imbue(std::locale::classic());
    boost::archive::text_iarchive ia(is, boost::archive::no_header);
    ia >> o;
    optim::check_params(o);
  } catch (const std::exception& e) {
    throw kvstore::error(errc::invalid_argument,
                         "bad parameters for optimizer \"" + std::string(name) + "\": " + e.what());
  }
  return o;
}

/// One registered type: its identity (to refuse a second type under the same name) and a
/// factory per element type the stores support.
struct registry_entry {
  std::type_index type;
  optim::updater<float> (*make_float)(std::string_view params);
  optim::updater<double> (*make_double)(std::string_view params);
};

template <optim::registered_optimizer O>
registry_entry entry_for() {
  return {std::type_index(typeid(O)),
          [](std::string_view p) {
            return optim::make_updater<float>(deserialize_params<O>(O::name, p));
          },
          [](std::string_view p) {
            return optim::make_updater<double>(deserialize_params<O>(O::name, p));
          }};
}

/// The registry itself. A function-local static, so it exists (with the built-in optimizers in
/// it) before any use, even one from another translation unit's static initializer.
struct optimizer_registry {
  std::mutex m;
  std::map<std::string, registry_entry, std::less<>> entries;

  optimizer_registry() {
    add<optim::sgd>();
    add<optim::adam>();
    add<optim::adagrad>();
    add<optim::add>();
  }

  template <optim::registered_optimizer O>
  void add() {
    entries.emplace(std::string(O::name), entry_for<O>());
  }
};

inline optimizer_registry& optimizers() {
  static optimizer_registry r;
  return r;
}

}  // namespace kvstore::detail

namespace kvstore::optim {

/// Registers O under O::name, so create_updater can build it from its name. Idempotent: returns
/// true when O is (now) registered. Throws kvstore::error(invalid_argument) if a different type
/// is already registered under the same name, since the two would silently disagree across
/// processes. Thread-safe.
template <registered_optimizer O>
bool register_optimizer() {
  auto& r = kvstore::detail::optimizers();
  std::lock_guard lk(r.m);
  auto it = r.entries.find(O::name);
  if (it == r.entries.end()) {
    r.entries.emplace(std::string(O::name), kvstore::detail::entry_for<O>());
    return true;
  }
  if (it->second.type != std::type_index(typeid(O)))
    throw kvstore::error(errc::invalid_argument, "optimizer name \"" + std::string(O::name) +
                                                     "\" is already registered by another type");
  return true;
}

/// True if an optimizer is registered under `name`. Thread-safe.
inline bool is_registered(std::string_view name) {
  auto& r = kvstore::detail::optimizers();
  std::lock_guard lk(r.m);
  return r.entries.find(name) != r.entries.end();
}

/// Rebuilds the updater of a registered optimizer from its name and serialized parameters (as
/// make_updater wrote them). T is float or double. Throws kvstore::error(invalid_argument) for an
/// unknown name or parameters that do not deserialize. Thread-safe.
template <class T>
updater<T> create_updater(std::string_view name, std::string_view params) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "optimizers are available for float and double elements");
  kvstore::detail::registry_entry e{std::type_index(typeid(void)), nullptr, nullptr};
  {
    auto& r = kvstore::detail::optimizers();
    std::lock_guard lk(r.m);
    auto it = r.entries.find(name);
    if (it == r.entries.end())
      throw kvstore::error(errc::invalid_argument,
                           "unknown optimizer \"" + std::string(name) +
                               "\" (register it with KVSTORE_REGISTER_OPTIMIZER)");
    e = it->second;
  }
  // Deserialize outside the lock: a slow or throwing user serialize() must not block others.
  if constexpr (std::is_same_v<T, float>)
    return e.make_float(params);
  else
    return e.make_double(params);
}

}  // namespace kvstore::optim

#define KVSTORE_DETAIL_CONCAT_IMPL(a, b) a##b
#define KVSTORE_DETAIL_CONCAT(a, b) KVSTORE_DETAIL_CONCAT_IMPL(a, b)

/// Registers an optimizer type at static initialization, so servers built from the same sources
/// can rebuild it by name. Use at namespace scope, followed by a semicolon:
///   KVSTORE_REGISTER_OPTIMIZER(my::signsgd);
/// Safe in headers and in several translation units (registration is idempotent).
#define KVSTORE_REGISTER_OPTIMIZER(Type)                                             \
  [[maybe_unused]] static const bool KVSTORE_DETAIL_CONCAT(                          \
      kvstore_registered_optimizer_, KVSTORE_DETAIL_CONCAT(__COUNTER__, __LINE__)) = \
      ::kvstore::optim::register_optimizer<Type>()
