# ctest driver (cmake -P): install the already-built flashcpp into a temporary prefix, then
# configure, build and run tests/consumer against it.
#   -DFLASHCPP_BUILD_DIR=  the flashcpp build tree      -DCONSUMER_SOURCE_DIR= tests/consumer
#   -DWORK_DIR=            scratch folder (recreated)     -DCONSUMER_GENERATOR=, -DCONSUMER_CXX_COMPILER=
#   -DCONSUMER_BUILD_TYPE= configuration to install/build -DCONSUMER_CUDA_ROOT= (CUDA builds only)
foreach(var FLASHCPP_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONSUMER_BUILD_TYPE)
  set(CONSUMER_BUILD_TYPE Release)
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  message(STATUS "consumer test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")

run_step("install" ${CMAKE_COMMAND} --install "${FLASHCPP_BUILD_DIR}" --prefix "${prefix}"
         --config ${CONSUMER_BUILD_TYPE})

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${build}" "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
if(CONSUMER_GENERATOR)
  list(APPEND configure_args -G "${CONSUMER_GENERATOR}")
endif()
if(CONSUMER_CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}")
endif()
if(CONSUMER_CUDA_ROOT)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CONSUMER_CUDA_ROOT}")
endif()
run_step("configure" ${CMAKE_COMMAND} ${configure_args})
run_step("build" ${CMAKE_COMMAND} --build "${build}" --config ${CONSUMER_BUILD_TYPE})

find_program(consumer_exe flashcpp_consumer PATHS "${build}" "${build}/${CONSUMER_BUILD_TYPE}"
             NO_DEFAULT_PATH REQUIRED)
run_step("run" "${consumer_exe}")
message(STATUS "${step_output}")
file(REMOVE_RECURSE "${WORK_DIR}")
