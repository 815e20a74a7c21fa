# Locates the torch the build must match (the one in the running Python) without torch's
# own TorchConfig.cmake, whose FindCUDA-era logic needs toolkit pieces (nvrtc, cuDNN,
# -DCUDA_TOOLKIT_ROOT_DIR) that an op library does not use.  Defines the target
# cutlass_ops::torch (headers, libraries, ABI define).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; d = os.path.dirname(torch.__file__); print(d); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
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
list(GET _torch_out 2 TORCH_CXX11_ABI)
if(TORCH_VERSION VERSION_GREATER_EQUAL 2.13)
  set(TORCH_CXX_STANDARD 20)
else()
  set(TORCH_CXX_STANDARD 17)
endif()
message(STATUS "cutlass_ops: torch ${TORCH_VERSION} at ${TORCH_DIR} (C++${TORCH_CXX_STANDARD})")

add_library(cutlass_ops_torch INTERFACE)
add_library(cutlass_ops::torch ALIAS cutlass_ops_torch)
target_include_directories(cutlass_ops_torch SYSTEM INTERFACE
  "${TORCH_DIR}/include" "${TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(cutlass_ops_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI} TORCH_API_INCLUDE_EXTENSION_H)
set(_torch_libs c10 torch_cpu torch)
if(CUTLASS_OPS_WITH_CUDA)
  list(APPEND _torch_libs c10_cuda)
endif()
foreach(_lib IN LISTS _torch_libs)
  find_library(TORCH_LIB_${_lib} ${_lib} PATHS "${TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(cutlass_ops_torch INTERFACE "${TORCH_LIB_${_lib}}")
endforeach()

# Only torch's c10/cuda headers may be used from the op sources: ATen/cuda/* include
# cusparse.h and cublas headers, which ship with torch's pip packages, not with every CUDA
# toolkit, so such an include breaks the build on a fresh machine.  Fail here, naming the file.
file(GLOB_RECURSE _op_sources "${CMAKE_SOURCE_DIR}/kernels/*.cpp" "${CMAKE_SOURCE_DIR}/kernels/*.h"
     "${CMAKE_SOURCE_DIR}/kernels/*.cu" "${CMAKE_SOURCE_DIR}/kernels/*.cuh")
foreach(_source IN LISTS _op_sources)
  file(STRINGS "${_source}" _aten_cuda REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]ATen/cuda/")
  if(_aten_cuda)
    message(FATAL_ERROR "cutlass_ops: ${_source} includes ATen/cuda (${_aten_cuda}); those headers "
            "need cusparse.h, which a plain CUDA toolkit lacks. Use c10/cuda/* or the CUDA runtime "
            "(e.g. kernels/common/stream_order.h instead of at::cuda::CUDAEvent).")
  endif()
endforeach()
