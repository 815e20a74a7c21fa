# Runs the generator (python/cutlass_ops_gen) at configure time.  Its sources, the manifest
# and the profiles are configure dependencies, so editing them re-runs it on the next build.
set(CUTLASS_OPS_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")
# Measured tile winners (profiles/<gpu>/sm<family>.csv); another folder for experiments.
set(CUTLASS_OPS_PROFILES "${CMAKE_SOURCE_DIR}/profiles" CACHE PATH "Folder of kernel profiles")
file(GLOB_RECURSE _gen_inputs CONFIGURE_DEPENDS
  "${CMAKE_SOURCE_DIR}/python/cutlass_ops_gen/*.py" "${CUTLASS_OPS_PROFILES}/*.csv")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_gen_inputs})

string(REPLACE ";" "," _archs_csv "${CUTLASS_OPS_ARCH_LIST}")
set(_gen_flags "")
if(CUTLASS_OPS_SM90_BACKWARD)  # ON/1/TRUE: family-90 dgrad/wgrad (only with 90 in the archs)
  list(APPEND _gen_flags --sm90-backward)
  if("90" IN_LIST CUTLASS_OPS_ARCH_LIST)
    message(STATUS "cutlass_ops: CUTLASS_OPS_SM90_BACKWARD=${CUTLASS_OPS_SM90_BACKWARD}: family-90 dgrad/wgrad kernels")
  endif()
endif()
message(STATUS "cutlass_ops: generating kernel set '${CUTLASS_OPS_KERNELS}'")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${CMAKE_SOURCE_DIR}/python:$ENV{PYTHONPATH}"
          "${Python_EXECUTABLE}" -m cutlass_ops_gen
          --archs "${_archs_csv}" --kernels "${CUTLASS_OPS_KERNELS}"
          --profiles "${CUTLASS_OPS_PROFILES}" --out "${CUTLASS_OPS_GENERATED_DIR}" ${_gen_flags}
  RESULT_VARIABLE _gen_rc OUTPUT_VARIABLE _gen_out ERROR_VARIABLE _gen_err)
if(NOT _gen_rc EQUAL 0)
  message(FATAL_ERROR "cutlass_ops: the kernel generator failed:\n${_gen_out}\n${_gen_err}")
endif()
message(STATUS "cutlass_ops: generated instances:\n${_gen_out}${_gen_err}")
include("${CUTLASS_OPS_GENERATED_DIR}/instances.cmake")
