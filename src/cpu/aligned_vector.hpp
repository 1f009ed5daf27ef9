#pragma once
// std::vector whose storage starts on a 64-byte cache line. The AMX kernels need it: a tile
// load or store whose 64-byte rows straddle two lines ran about 3x slower than an aligned one
// on the development machine (Sapphire Rapids class), and malloc gives only 16-byte alignment.
#include <cstddef>
#include <new>
#include <vector>

namespace flashcpp::detail::cpu {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};

  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), kAlignment));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete(p, n * sizeof(T), kAlignment);
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace flashcpp::detail::cpu
