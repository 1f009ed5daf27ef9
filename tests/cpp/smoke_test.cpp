#include <gtest/gtest.h>
#include "flashcpp/flashcpp.hpp"
TEST(Smoke, BadRankNamesArgument) {
  float buf[16] = {};
  auto q = flashcpp::TensorView::contiguous(buf, flashcpp::DType::fp32, {1, 1, 8});
  try {
    flashcpp::forward(q, q, q, q);
    FAIL() << "expected an error";
  } catch (const flashcpp::Error& e) {
    EXPECT_STREQ(e.what(), "q: expected 4 dimensions [B, Nq, Hq, D], got 3");
  }
}
