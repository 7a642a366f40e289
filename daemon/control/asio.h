// Boost.Asio with C++20 coroutines. Boost 1.74's awaitable.hpp uses std::exchange without
// including <utility>, so every file includes Asio through this header.
#pragma once

#include <utility>

#include <boost/asio.hpp>
