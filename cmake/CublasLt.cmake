# cuBLASLt for linear_residual (kernels/linear_residual): the CUDA toolkit's where it has one,
# else the nvidia-cublas wheel that torch's CUDA build depends on (its headers and
# libcublasLt.so.<major> under site-packages/nvidia/...).  Either way the library resolves at run
# time, by its soname, to the one torch has loaded.  Sets CUTLASS_OPS_CUBLASLT_TARGET.
if(TARGET CUDA::cublasLt)
  set(CUTLASS_OPS_CUBLASLT_TARGET CUDA::cublasLt)
  message(STATUS "cutlass_ops: cuBLASLt from the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR})")
  return()
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import glob, os, sys\nfor p in sys.path:\n    for h in sorted(glob.glob(os.path.join(p, 'nvidia', '*', 'include', 'cublasLt.h'))):\n        print(os.path.dirname(os.path.dirname(h))); raise SystemExit"
  OUTPUT_VARIABLE _cublas_root OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _cublas_rc)
file(GLOB _cublaslt_libs "${_cublas_root}/lib/libcublasLt.so.*")
list(FILTER _cublaslt_libs EXCLUDE REGEX "\\.so\\.[0-9]+\\.")  # the soname link, not a versioned file
if(_cublas_root STREQUAL "" OR NOT _cublaslt_libs)
  message(FATAL_ERROR "cutlass_ops: cuBLASLt not found: neither the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR}) "
                      "nor an nvidia-cublas wheel beside ${Python_EXECUTABLE}'s torch has it "
                      "(pip install nvidia-cublas matching torch's CUDA)")
endif()
list(GET _cublaslt_libs 0 _cublaslt_lib)
add_library(cutlass_ops_cublaslt SHARED IMPORTED)
set_target_properties(cutlass_ops_cublaslt PROPERTIES IMPORTED_LOCATION "${_cublaslt_lib}"
                      INTERFACE_INCLUDE_DIRECTORIES "${_cublas_root}/include")
set(CUTLASS_OPS_CUBLASLT_TARGET cutlass_ops_cublaslt)
message(STATUS "cutlass_ops: cuBLASLt from ${_cublaslt_lib}")
