# CUTLASS headers and the Python emitter come from the nvidia-cutlass wheel (pinned in
# pyproject.toml).  Defines cutlass_ops::cutlass (include dirs) and CUTLASS_LIBRARY_DIR.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, cutlass_library as c; print(os.path.dirname(c.__file__))"
  OUTPUT_VARIABLE CUTLASS_LIBRARY_DIR RESULT_VARIABLE _rc ERROR_VARIABLE _err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cutlass_ops: the nvidia-cutlass wheel is missing (${_err}).\n"
          "pip install nvidia-cutlass==4.2.0.0")
endif()
set(CUTLASS_INCLUDE_DIR "${CUTLASS_LIBRARY_DIR}/source/include")
if(NOT EXISTS "${CUTLASS_INCLUDE_DIR}/cutlass/cutlass.h")
  message(FATAL_ERROR "cutlass_ops: no CUTLASS headers under ${CUTLASS_INCLUDE_DIR}")
endif()
add_library(cutlass_ops_cutlass INTERFACE)
add_library(cutlass_ops::cutlass ALIAS cutlass_ops_cutlass)
target_include_directories(cutlass_ops_cutlass SYSTEM INTERFACE
  "${CUTLASS_INCLUDE_DIR}" "${CUTLASS_LIBRARY_DIR}/source/tools/util/include")
message(STATUS "cutlass_ops: CUTLASS headers ${CUTLASS_INCLUDE_DIR}")
