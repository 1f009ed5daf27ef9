# Copies a folder of an installed Python package (nanobind's sources, nvidia-cutlass's CuTe
# headers) into the build folder, once per package version.
#
# Why: pip's build isolation installs the build requirements into a new temporary folder for
# every `pip install .`. Compiling against that folder directly puts a new path into every
# compile command, so ninja (and ccache) rebuild everything each time. The staged copy has a
# fixed path and is refreshed only when the package's version changes.

# Sets `out_var` to the staged copy of <package folder>/<subdir> of the importable `module`
# (whose distribution is `dist`), or to "" when `python` cannot find the module.
function(flashcpp_stage_python_package python module dist subdir out_var)
  execute_process(
    COMMAND "${python}" -c "
import importlib.metadata as m, importlib.util as u, sys
spec = u.find_spec(sys.argv[1])
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
print(list(spec.submodule_search_locations)[0] + ';' + m.version(sys.argv[2]), end='')
" "${module}" "${dist}"
    OUTPUT_VARIABLE _found
    RESULT_VARIABLE _rc
    ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    set(${out_var} "" PARENT_SCOPE)
    return()
  endif()
  list(GET _found 0 _package_dir)
  list(GET _found 1 _version)
  set(_dest "${CMAKE_BINARY_DIR}/_staged/${module}")
  set(_stamp "${_dest}.version")
  set(_staged_version "")
  if(EXISTS "${_stamp}")
    file(READ "${_stamp}" _staged_version)
  endif()
  if(NOT _staged_version STREQUAL _version)
    message(STATUS "flashcpp: staging ${dist} ${_version} into ${_dest}")
    file(REMOVE_RECURSE "${_dest}")
    file(COPY "${_package_dir}/${subdir}/" DESTINATION "${_dest}"
         PATTERN "__pycache__" EXCLUDE)
    file(WRITE "${_stamp}" "${_version}")
  endif()
  set(${out_var} "${_dest}" PARENT_SCOPE)
endfunction()
