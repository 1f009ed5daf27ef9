#pragma once
// The key order of the FP8 P V product on sm90a, shared by the kernel (P in registers), the
// V^T pre-pass (fwd_fp8_vt_prepass.cuh) and a CPU test of the index math.
//
// wgmma with e4m3 operands needs both operands K-major and takes k = 32 keys per instruction.
// Within one 32-key chunk the fp32 S accumulator and the e4m3 A-operand fragment of P V give a
// thread different key columns (PTX ISA, wgmma register fragments, thread t of its warp,
// quad position q = t % 4):
//   S (f32 D layout):   row t/4 (and +8) holds keys 8i + 2q + {0, 1} for i = 0..3;
//   A (8-bit layout):   row t/4 (and +8) holds slots 4q + {0..3} and 16 + 4q + {0..3}.
// Both are 8 values per row, so each thread can pack its own accumulator values into its own
// A registers without any shuffle, provided V's rows are stored in the matching order: A slot
// a = 16h + 4q + e (h, e: the register half and byte) receives the key
//   key(a) = 16h + 8 (e / 2) + 2q + e % 2,
// a permutation of 0..31 within each chunk (the sum over keys does not care about the order).
// The kernel packs accumulator values {16c + 8h + 2r + 4j + b} (r: row half, j, b in {0, 1})
// into A register (r, h) of chunk c, byte 2j + b; the pre-pass stores V^T with column a of each
// 32-key chunk holding key key(a) of that chunk.
#include "common/host_device.hpp"

namespace flashcpp::detail::cuda::sm90 {

inline constexpr int kFp8PvChunk = 32;  // keys per e4m3 wgmma k step

// The accumulator value (0..15 of the chunk's 16 per thread, index 4i + 2r + b for key
// 8i + 2q + b, row half r) that the kernel packs into byte `byte` of A register `reg` (bytes
// 0, 1 and 2, 3 are two neighbouring accumulator values: one cvt e4m3x2 each).
FLASHCPP_HOST_DEVICE constexpr int fp8_pv_acc_index(int reg, int byte) {
  return 8 * (reg / 2) + 2 * (reg % 2) + 4 * (byte / 2) + byte % 2;
}

// The key (0..31, within its chunk) whose P value sits in A-fragment slot `slot` (0..31).
FLASHCPP_HOST_DEVICE constexpr int fp8_pv_key_of_slot(int slot) {
  const int h = slot / 16, q = (slot % 16) / 4, e = slot % 4;
  return 16 * h + 8 * (e / 2) + 2 * q + e % 2;
}

}  // namespace flashcpp::detail::cuda::sm90
