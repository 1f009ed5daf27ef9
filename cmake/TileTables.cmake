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

# Sets `out` to the first field (the head dim) of every entry of the array `table` in `header`.
function(flashcpp_table_head_dims header table out)
  flashcpp_table_body("${header}" ${table} _body)
  string(REGEX MATCHALL "{ *[0-9]+," _entries "${_body}")
  set(_dims "")
  foreach(_entry IN LISTS _entries)
    string(REGEX REPLACE "[^0-9]" "" _dim "${_entry}")
    list(APPEND _dims "${_dim}")
  endforeach()
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
