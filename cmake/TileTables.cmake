# The head dims the build instantiates come from the kernels' tile tables (the same constexpr
# arrays the host planner and the device traits read), so adding a tile row adds its TUs.

# Sets `out` to the initializer of the array `table` in `header` (comments removed), and makes
# the header a configure dependency.
function(flashcpp_table_body header table out)
  file(READ "${header}" _text)
  string(REGEX REPLACE "//[^\n]*" "" _text "${_text}")
  string(REGEX MATCH "${table}\\[\\] = {[^;]*};" _body "${_text}")
  if(NOT _body)
    message(FATAL_ERROR "flashcpp: no tile table ${table} in ${header}")
  endif()
  set(${out} "${_body}" PARENT_SCOPE)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")
endfunction()

# Sets `out` to the first field (the head dim) of every entry of the array `table` in `header`,
# each once (a head dim may have several rows).
function(flashcpp_table_head_dims header table out)
  flashcpp_table_body("${header}" ${table} _body)
  string(REGEX MATCHALL "{ *[0-9]+," _entries "${_body}")
  set(_dims "")
  foreach(_entry IN LISTS _entries)
    string(REGEX REPLACE "[^0-9]" "" _dim "${_entry}")
    list(APPEND _dims "${_dim}")
  endforeach()
  list(REMOVE_DUPLICATES _dims)
  set(${out} "${_dims}" PARENT_SCOPE)
endfunction()

# For a table whose rows start with (head_dim, head_dim_v): `square` gets the head dims of the
# rows with head_dim == head_dim_v, `pairs` the "DxDv" names of the others (e.g. 192x128).
function(flashcpp_table_head_dim_pairs header table square pairs)
  flashcpp_table_body("${header}" ${table} _body)
  string(REGEX MATCHALL "{ *[0-9]+, *[0-9]+," _entries "${_body}")
  set(_square "")
  set(_pairs "")
  foreach(_entry IN LISTS _entries)
    string(REGEX MATCH "([0-9]+), *([0-9]+)" _m "${_entry}")
    if(CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
      list(APPEND _square "${CMAKE_MATCH_1}")
    else()
      list(APPEND _pairs "${CMAKE_MATCH_1}x${CMAKE_MATCH_2}")
    endif()
  endforeach()
  set(${square} "${_square}" PARENT_SCOPE)
  set(${pairs} "${_pairs}" PARENT_SCOPE)
endfunction()

set(_tables "${CMAKE_CURRENT_LIST_DIR}/../src/cuda")
flashcpp_table_head_dims("${_tables}/sm80/fwd_tile_table.hpp" kSm80FwdTiles FLASHCPP_SM80_FWD_HEAD_DIMS)
flashcpp_table_head_dims("${_tables}/sm80/bwd_tile_table.hpp" kSm80BwdTiles FLASHCPP_SM80_BWD_HEAD_DIMS)
flashcpp_table_head_dim_pairs("${_tables}/sm90/fwd_tile_table.hpp" kSm90FwdTiles
                              FLASHCPP_SM90_FWD_HEAD_DIMS FLASHCPP_SM90_FWD_HEAD_DIM_PAIRS)
flashcpp_table_head_dims("${_tables}/sm90/fwd_tile_table.hpp" kSm90FwdTilesFp8
                         FLASHCPP_SM90_FP8_FWD_HEAD_DIMS)
flashcpp_table_head_dim_pairs("${_tables}/sm90/bwd_tile_table.hpp" kSm90BwdTiles
                              FLASHCPP_SM90_BWD_HEAD_DIMS FLASHCPP_SM90_BWD_HEAD_DIM_PAIRS)
flashcpp_table_head_dims("${_tables}/sm80/decode_tile_table.hpp" kDecodeTiles FLASHCPP_DECODE_HEAD_DIMS)
unset(_tables)

# sm90a forward tile variants without editing the tables (A/B builds side by side), one switch
# per head dim d of the D == Dv rows 64, 128, 256: <block_n>x<stages> overrides that row's key
# block and stage count, empty keeps the table's. The values go into a generated header
# (sm90_fwd_tile_overrides.inc, written by src/cuda/CMakeLists.txt, read by fwd_tile_table.hpp)
# instead of the command line, so switching a variant in one build folder recompiles only the
# TUs that read the table; the kernel name carries the tile.
#  FLASHCPP_SM90_FWD_TILE_D<d>  the fp16/bf16 rows (kSm90FwdTiles), e.g. 176x2
#  FLASHCPP_SM90_FP8_TILE_D<d>  the FP8 rows (kSm90FwdTilesFp8), e.g. 224x2
#  FLASHCPP_SM90_FP8_FAST_TILE_D<d>  the FP8 fast-accumulation rows (kSm90FwdTilesFp8FastAccum)
set(FLASHCPP_SM90_FWD_TILE_OVERRIDES "")
function(flashcpp_sm90_fwd_tile_switches kind what)  # kind: FWD, FP8 or FP8_FAST
  foreach(_d IN ITEMS 64 128 256)
    set(_var FLASHCPP_SM90_${kind}_TILE_D${_d})
    set(${_var} "" CACHE STRING
        "${what} sm90a forward tile override for head dim ${_d}: <block_n>x<stages>, empty: the table's")
    if(NOT "${${_var}}" STREQUAL "")
      if(NOT "${${_var}}" MATCHES "^([0-9]+)x([0-9]+)$")
        message(FATAL_ERROR "flashcpp: ${_var} '${${_var}}' (expected <block_n>x<stages>, e.g. 128x2)")
      endif()
      string(APPEND FLASHCPP_SM90_FWD_TILE_OVERRIDES
             "#define FLASHCPP_SM90_${kind}_D${_d}_BLOCK_N ${CMAKE_MATCH_1}\n"
             "#define FLASHCPP_SM90_${kind}_D${_d}_STAGES ${CMAKE_MATCH_2}\n")
      message(STATUS "flashcpp: ${what} sm90a forward d${_d} tile 128x${CMAKE_MATCH_1}, ${CMAKE_MATCH_2} stages")
    endif()
  endforeach()
  set(FLASHCPP_SM90_FWD_TILE_OVERRIDES "${FLASHCPP_SM90_FWD_TILE_OVERRIDES}" PARENT_SCOPE)
endfunction()
flashcpp_sm90_fwd_tile_switches(FWD "fp16/bf16")
flashcpp_sm90_fwd_tile_switches(FP8 "FP8")
flashcpp_sm90_fwd_tile_switches(FP8_FAST "FP8 fast-accumulation")
# More sm90a forward A/B switches, head dims from which a code variant applies (empty: the
# default of fwd_traits.hpp; 512: never), written to the same header (fwd_traits.hpp says what
# they do):
#  FLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM      Q's wgmma descriptors rebuilt per key block;
#  FLASHCPP_SM90_FWD_O_IN_RING_MIN_HDIM   O stored with TMA through the last key block's K and
#                                         V stages where no O buffer fits (d256, 192 x 128).
foreach(_switch IN ITEMS Q_DESC O_IN_RING)
  set(_var FLASHCPP_SM90_FWD_${_switch}_MIN_HDIM)
  set(${_var} "" CACHE STRING "sm90a forward: ${_switch} variant from this head dim up (empty: the default; 512: never)")
  if(NOT ${_var} STREQUAL "")
    if(NOT ${_var} MATCHES "^[0-9]+$")
      message(FATAL_ERROR "flashcpp: ${_var} '${${_var}}' (expected a head dim, e.g. 256)")
    endif()
    string(APPEND FLASHCPP_SM90_FWD_TILE_OVERRIDES "#define ${_var} ${${_var}}\n")
    message(STATUS "flashcpp: sm90a forward ${_switch} from head dim ${${_var}}")
  endif()
endforeach()
unset(_var)
# FLASHCPP_SM90_FWD_LONG_TILE_D64=<rows>x<keys>: d64's long-call tile (fwd_tile_table.hpp;
# rows 192: three consumer warpgroups, or 128), 0x0: none, empty: the table's 192x96.
set(FLASHCPP_SM90_FWD_LONG_TILE_D64 "" CACHE STRING
    "sm90a forward d64 long-call tile: <rows>x<keys>, 0x0: none (empty: the table's)")
if(NOT FLASHCPP_SM90_FWD_LONG_TILE_D64 STREQUAL "")
  if(NOT FLASHCPP_SM90_FWD_LONG_TILE_D64 MATCHES "^(0x0|(128|192)x[1-9][0-9]*)$")
    message(FATAL_ERROR "flashcpp: FLASHCPP_SM90_FWD_LONG_TILE_D64 '${FLASHCPP_SM90_FWD_LONG_TILE_D64}' (expected <rows>x<keys> with rows 128 or 192, e.g. 192x96, or 0x0)")
  endif()
  string(REGEX MATCH "^([0-9]+)x([0-9]+)$" _tile "${FLASHCPP_SM90_FWD_LONG_TILE_D64}")
  string(APPEND FLASHCPP_SM90_FWD_TILE_OVERRIDES
         "#define FLASHCPP_SM90_FWD_D64_LONG_BLOCK_M ${CMAKE_MATCH_1}\n"
         "#define FLASHCPP_SM90_FWD_D64_LONG_BLOCK_N ${CMAKE_MATCH_2}\n")
  message(STATUS "flashcpp: sm90a forward d64 long-call tile ${FLASHCPP_SM90_FWD_LONG_TILE_D64}")
  unset(_tile)
endif()
# FLASHCPP_SM90_FP8_PV_CHUNK_D<d>=<width>[x<temps>] (e.g. 32x2, 64x1, 256): the FP8 forward of
# head dim d sums each key block's P V apart from O in chunks of <width> Dv columns, with
# <temps> temporaries in flight (default 2; fp8_pv_chunks.hpp); 0: O stays the tensor cores'
# P V accumulator along the row (it loses small terms on long rows). Empty: the table's.
foreach(_d IN ITEMS 64 128 256)
  set(FLASHCPP_SM90_FP8_PV_CHUNK_D${_d} "" CACHE STRING
      "FP8 sm90a forward P V chunks for head dim ${_d}: <width>[x<temps>], 0: none, empty: the table's")
  set(_chunk "${FLASHCPP_SM90_FP8_PV_CHUNK_D${_d}}")
  if(NOT _chunk STREQUAL "")
    if(NOT _chunk MATCHES "^([0-9]+)(x([0-9]+))?$")
      message(FATAL_ERROR "flashcpp: FLASHCPP_SM90_FP8_PV_CHUNK_D${_d} '${_chunk}' (expected "
                          "<width>[x<temps>], e.g. 32x2, or 0)")
    endif()
    set(_temps 2)
    if(NOT "${CMAKE_MATCH_3}" STREQUAL "")  # (a bare if() would read an explicit x0 as unset)
      set(_temps ${CMAKE_MATCH_3})
    endif()
    string(APPEND FLASHCPP_SM90_FWD_TILE_OVERRIDES
           "#define FLASHCPP_SM90_FP8_D${_d}_PV_CHUNK ${CMAKE_MATCH_1}\n"
           "#define FLASHCPP_SM90_FP8_D${_d}_PV_TEMPS ${_temps}\n")
    if(CMAKE_MATCH_1 EQUAL 0)
      message(STATUS "flashcpp: FP8 sm90a forward d${_d} P V on the tensor cores' O (no per-block sum)")
    else()
      message(STATUS "flashcpp: FP8 sm90a forward d${_d} P V chunks of ${CMAKE_MATCH_1}, ${_temps} temporaries")
    endif()
  endif()
endforeach()
unset(_chunk)
unset(_temps)
# The switch these replace (one head-dim limit for a whole-width per-block sum).
if(NOT "${FLASHCPP_SM90_FP8_PV_PROMOTE_MAX_HDIM}" STREQUAL "")
  message(FATAL_ERROR "flashcpp: FLASHCPP_SM90_FP8_PV_PROMOTE_MAX_HDIM is gone: use "
                      "FLASHCPP_SM90_FP8_PV_CHUNK_D<d> (the old default: D64 64, D128 128, D256 0)")
endif()
# FLASHCPP_SM80_FWD_PAIRS: the sm80 forward's d256 warp-pair tile row (fwd_tile_table.hpp) is
# built, to be run with FLASHCPP_SM80_FWD_TILE_D256=128x64_8w_kv2_pairs (the tile choice never
# takes it).
option(FLASHCPP_SM80_FWD_PAIRS "sm80 forward: build the d256 warp-pair tile row (A/B runs)" OFF)
if(FLASHCPP_SM80_FWD_PAIRS)
  add_compile_definitions(FLASHCPP_SM80_FWD_PAIRS)
endif()
