# FusedMLP kernels built ahead of time (python/cutlass_ops_gen/mlp_aot.py) for the models of the
# JSON manifest that CUTLASS_OPS_MLP_MODELS names (none by default), for each arch of the build
# that runs FusedMLP (80, 86, 87, 89, 90): compiled with nvcc as the runtime would, installed into
# cutlass_ops/mlp_aot/<key>/fused_mlp.so, where cutlass_ops.mlp_jit looks before compiling.
set(CUTLASS_OPS_MLP_MODELS "$ENV{CUTLASS_OPS_MLP_MODELS}" CACHE FILEPATH
    "JSON manifest of FusedMLP models to build ahead of time (see cutlass_ops_gen/mlp_aot.py)")
# The environment variable, when set, wins over the cached value: a rebuild in the same build
# folder with another manifest must not build the first one's kernels again.
if(DEFINED ENV{CUTLASS_OPS_MLP_MODELS})
  set_property(CACHE CUTLASS_OPS_MLP_MODELS PROPERTY VALUE "$ENV{CUTLASS_OPS_MLP_MODELS}")
endif()
set(CUTLASS_OPS_MLP_AOT_COUNT 0)
if(CUTLASS_OPS_MLP_MODELS)
  get_filename_component(_mlp_manifest "${CUTLASS_OPS_MLP_MODELS}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
  if(NOT EXISTS "${_mlp_manifest}")
    message(FATAL_ERROR "cutlass_ops: CUTLASS_OPS_MLP_MODELS=${CUTLASS_OPS_MLP_MODELS}: no such file")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_mlp_manifest}")
  set(_mlp_aot_dir "${CMAKE_BINARY_DIR}/mlp_aot")
  file(REMOVE_RECURSE "${_mlp_aot_dir}")  # no kernels left over from an earlier manifest
  string(REPLACE ";" "," _mlp_archs "${CUTLASS_OPS_ARCH_LIST}")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${CMAKE_SOURCE_DIR}/python:$ENV{PYTHONPATH}"
            "${Python_EXECUTABLE}" -m cutlass_ops_gen.mlp_aot --manifest "${_mlp_manifest}"
            --archs "${_mlp_archs}" --out "${_mlp_aot_dir}"
    RESULT_VARIABLE _mlp_rc OUTPUT_VARIABLE _mlp_out ERROR_VARIABLE _mlp_err)
  if(NOT _mlp_rc EQUAL 0)
    message(FATAL_ERROR "cutlass_ops: the FusedMLP ahead-of-time generator failed:\n${_mlp_out}\n${_mlp_err}")
  endif()
  message(STATUS "cutlass_ops: FusedMLP kernels ahead of time (${_mlp_manifest}):\n${_mlp_out}")
  include("${_mlp_aot_dir}/mlp_aot.cmake")
  list(LENGTH CUTLASS_OPS_MLP_AOT_LIBRARIES CUTLASS_OPS_MLP_AOT_COUNT)
  if(CUTLASS_OPS_MLP_AOT_COUNT GREATER 0)
    add_custom_target(cutlass_ops_mlp_aot ALL DEPENDS ${CUTLASS_OPS_MLP_AOT_LIBRARIES})
  endif()
  install(DIRECTORY "${_mlp_aot_dir}/" DESTINATION cutlass_ops/mlp_aot
          FILES_MATCHING PATTERN "fused_mlp.so" PATTERN "meta.json" PATTERN "index.json")
endif()
