#pragma once
// flashcpp: exact attention (FlashAttention) for C++ and CUDA. Include this one header.
#include "flashcpp/attention.hpp"
#include "flashcpp/error.hpp"
#include "flashcpp/kvcache.hpp"
#include "flashcpp/options.hpp"
#include "flashcpp/tensor.hpp"
#include "flashcpp/version.hpp"
