// Everything of optim/: the built-in optimizers (registered by the library), the registry and
// the optimizer-state file.
#pragma once

#include <kvstore/optim/adagrad.hpp>
#include <kvstore/optim/adam.hpp>
#include <kvstore/optim/add.hpp>
#include <kvstore/optim/grad.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/registry.hpp>
#include <kvstore/optim/sgd.hpp>
#include <kvstore/optim/state_file.hpp>
#include <kvstore/optim/state_serialization.hpp>
