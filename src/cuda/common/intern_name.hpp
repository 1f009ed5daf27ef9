#pragma once
// Stable storage for the kernel names handed out in RunInfo (a const char* that outlives the
// call): each distinct name is stored once, in a deque so earlier c_str()s stay valid.
#include <deque>
#include <mutex>
#include <string>

namespace flashcpp::detail::cuda {

inline const char* intern_name(const std::string& name) {
  static std::mutex mutex;
  static std::deque<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& n : names)
    if (n == name) return n.c_str();
  names.push_back(name);
  return names.back().c_str();
}

}  // namespace flashcpp::detail::cuda
