# Which SM archs to compile for: CUTLASS_OPS_ARCHS (cache or environment), e.g. "80;86;90".
# Default: the GPU of this machine if torch sees one, else 80;86;90.
# Sets CUTLASS_OPS_ARCH_LIST (numbers) and checks that the toolkit can build them.
set(_default_archs "80;86;90")
if(DEFINED ENV{CUTLASS_OPS_ARCHS} AND NOT DEFINED CACHE{CUTLASS_OPS_ARCHS})
  set(CUTLASS_OPS_ARCHS "$ENV{CUTLASS_OPS_ARCHS}" CACHE STRING "SM archs to build, e.g. 80;86;90")
endif()
if(NOT CUTLASS_OPS_ARCHS)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import torch; c = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; print('%d%d' % c if c else '')"
    OUTPUT_VARIABLE _local_arch OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_local_arch)
    set(CUTLASS_OPS_ARCHS "${_local_arch}")
    message(STATUS "cutlass_ops: building for this machine's GPU, sm${_local_arch}")
  else()
    set(CUTLASS_OPS_ARCHS "${_default_archs}")
    message(STATUS "cutlass_ops: no GPU seen; building for the default archs ${_default_archs}")
  endif()
endif()
string(REPLACE "," ";" CUTLASS_OPS_ARCH_LIST "${CUTLASS_OPS_ARCHS}")
list(TRANSFORM CUTLASS_OPS_ARCH_LIST REPLACE "^sm_?" "")

foreach(_arch IN LISTS CUTLASS_OPS_ARCH_LIST)
  if(NOT _arch MATCHES "^[0-9]+$")
    message(FATAL_ERROR "cutlass_ops: bad arch '${_arch}' in CUTLASS_OPS_ARCHS='${CUTLASS_OPS_ARCHS}'")
  endif()
  if(_arch LESS 70)
    message(FATAL_ERROR "cutlass_ops: sm${_arch} is not supported (tensor-core kernels need sm70+)")
  endif()
  if(_arch LESS 75 AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    message(FATAL_ERROR
      "cutlass_ops: sm${_arch} (Volta) was requested, but CUDA ${CMAKE_CUDA_COMPILER_VERSION} "
      "cannot compile it: CUDA 13 dropped the sm70/sm72 targets. Build the Volta kernels with a "
      "CUDA 12.x toolkit (CUDACXX=/path/to/cuda-12/bin/nvcc; the library then loads into torch's CUDA 12 "
      "builds), or drop ${_arch} from "
      "CUTLASS_OPS_ARCHS.")
  endif()
endforeach()
message(STATUS "cutlass_ops: archs ${CUTLASS_OPS_ARCH_LIST}")

# CMake's CUDA_ARCHITECTURES for one kernel family: machine code for each arch, PTX for the
# newest so that later GPUs can JIT it.  Family 90 (wgmma/TMA, arch-conditional sm_90a code)
# is not set through CUDA_ARCHITECTURES: see cutlass_ops_family_gencode below.
function(cutlass_ops_family_architectures family out_var)
  if(family EQUAL 90)
    set(${out_var} OFF PARENT_SCOPE)
    return()
  endif()
  set(_sel)
  foreach(_arch IN LISTS CUTLASS_OPS_ARCH_LIST)
    if((family EQUAL 80 AND _arch GREATER_EQUAL 80) OR (family EQUAL 70 AND _arch LESS 80))
      list(APPEND _sel "${_arch}-real")
    endif()
  endforeach()
  list(LENGTH _sel _n)
  if(_n GREATER 0)
    list(GET _sel -1 _last)
    string(REPLACE "-real" "" _last_virtual "${_last}")
    list(APPEND _sel "${_last_virtual}-virtual")
  endif()
  set(${out_var} "${_sel}" PARENT_SCOPE)
endfunction()

# Every requested arch (for kernels without CUTLASS), PTX for the newest.
function(cutlass_ops_all_architectures out_var)
  set(_sel)
  foreach(_arch IN LISTS CUTLASS_OPS_ARCH_LIST)
    list(APPEND _sel "${_arch}-real")
  endforeach()
  list(GET CUTLASS_OPS_ARCH_LIST -1 _last)
  list(APPEND _sel "${_last}-virtual")
  set(${out_var} "${_sel}" PARENT_SCOPE)
endfunction()

# nvcc flags that pick a family's targets when CUDA_ARCHITECTURES cannot: family 90 is
# compiled for sm_90a only (machine code, no PTX: arch-specific "a" code runs on sm90 alone,
# and CMake < 3.29 cannot spell "90a" in CUDA_ARCHITECTURES).
function(cutlass_ops_family_gencode family out_var)
  set(_flags)
  if(family EQUAL 90 AND "90" IN_LIST CUTLASS_OPS_ARCH_LIST)
    set(_flags "-gencode=arch=compute_90a,code=sm_90a")
  endif()
  set(${out_var} "${_flags}" PARENT_SCOPE)
endfunction()
