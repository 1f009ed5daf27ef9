#pragma once
// The one exception type every public flashcpp call throws on invalid input or a failed
// backend call. The message names the argument and says what was expected.
#include <stdexcept>
#include <string>

namespace flashcpp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace flashcpp
