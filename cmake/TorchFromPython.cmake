# Locates the torch the build must match (the one in the running Python) without torch's
# own TorchConfig.cmake, whose FindCUDA-era logic needs toolkit pieces (nvrtc, cuDNN,
# -DCUDA_TOOLKIT_ROOT_DIR) that an op library does not use.  Defines the target
# cutlass_ops::torch (headers, libraries, the stable-ABI target version).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; d = os.path.dirname(torch.__file__); print(d); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_out RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "cutlass_ops: could not import torch with ${Python_EXECUTABLE}:\n${_torch_err}\n"
          "Install torch first and build with `pip install --no-build-isolation .`, so the op "
          "library matches the torch it will load into.")
endif()
string(REPLACE "\n" ";" _torch_out "${_torch_out}")
list(GET _torch_out 0 TORCH_DIR)
list(GET _torch_out 1 TORCH_VERSION)
# The op library uses LibTorch's stable ABI only (kernels/common/torch_stable.h): compiled
# for the stable API of torch ${CUTLASS_OPS_TORCH_MIN} (TORCH_TARGET_VERSION), it loads into that
# torch and every later one, whichever torch it was built against.
set(CUTLASS_OPS_TORCH_MIN 2.11)
if(TORCH_VERSION VERSION_LESS CUTLASS_OPS_TORCH_MIN)
  message(FATAL_ERROR "cutlass_ops: torch ${TORCH_VERSION} is too old to build against: the op library "
          "uses LibTorch's stable ABI as of torch ${CUTLASS_OPS_TORCH_MIN}. Install torch >= ${CUTLASS_OPS_TORCH_MIN}.")
endif()
# torch 2.13+ headers require C++20; older torch is C++17.
if(TORCH_VERSION VERSION_GREATER_EQUAL 2.13)
  set(TORCH_CXX_STANDARD 20)
else()
  set(TORCH_CXX_STANDARD 17)
endif()
message(STATUS "cutlass_ops: torch ${TORCH_VERSION} at ${TORCH_DIR} (C++${TORCH_CXX_STANDARD}), "
               "stable ABI of torch ${CUTLASS_OPS_TORCH_MIN}")

add_library(cutlass_ops_torch INTERFACE)
add_library(cutlass_ops::torch ALIAS cutlass_ops_torch)
target_include_directories(cutlass_ops_torch SYSTEM INTERFACE "${TORCH_DIR}/include")
string(REPLACE "." ";" _torch_min "${CUTLASS_OPS_TORCH_MIN}")
list(GET _torch_min 0 _torch_min_major)
list(GET _torch_min 1 _torch_min_minor)
math(EXPR _torch_min_minor_hex "${_torch_min_minor}" OUTPUT_FORMAT HEXADECIMAL)
string(REPLACE "0x" "" _torch_min_minor_hex "${_torch_min_minor_hex}")
string(LENGTH "${_torch_min_minor_hex}" _len)
if(_len EQUAL 1)
  set(_torch_min_minor_hex "0${_torch_min_minor_hex}")
endif()
# e.g. 0x020b000000000000 for 2.11 (major << 56 | minor << 48)
target_compile_definitions(cutlass_ops_torch INTERFACE
  TORCH_TARGET_VERSION=0x0${_torch_min_major}${_torch_min_minor_hex}000000000000)
# The stable ABI's C symbols live in libtorch_cpu (aoti_torch_*, torch_call_dispatcher) and,
# for the current CUDA stream, libtorch_cuda.
set(_torch_libs torch_cpu torch)
if(CUTLASS_OPS_WITH_CUDA)
  list(APPEND _torch_libs torch_cuda)
  target_compile_definitions(cutlass_ops_torch INTERFACE USE_CUDA)
endif()
foreach(_lib IN LISTS _torch_libs)
  find_library(TORCH_LIB_${_lib} ${_lib} PATHS "${TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(cutlass_ops_torch INTERFACE "${TORCH_LIB_${_lib}}")
endforeach()

# Only the stable ABI may be used from the op sources: an ATen, c10 or torch/library.h
# include ties the library to one torch minor version again (and ATen/cuda/* needs cusparse.h,
# which a plain CUDA toolkit lacks).  Fail here, naming the file.
file(GLOB_RECURSE _op_sources "${CMAKE_SOURCE_DIR}/kernels/*.cpp" "${CMAKE_SOURCE_DIR}/kernels/*.h"
     "${CMAKE_SOURCE_DIR}/kernels/*.cu" "${CMAKE_SOURCE_DIR}/kernels/*.cuh")
foreach(_source IN LISTS _op_sources)
  file(STRINGS "${_source}" _unstable REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](ATen|c10|torch/library\\.h|torch/extension\\.h)")
  if(_unstable)
    message(FATAL_ERROR "cutlass_ops: ${_source} includes torch's C++ API (${_unstable}); the op "
            "library uses LibTorch's stable ABI only: use kernels/common/torch_stable.h.")
  endif()
endforeach()
