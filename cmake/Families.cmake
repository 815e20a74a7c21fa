# The op families: each kernels/<family>/sources.cmake declares its hand-written sources with
# cutlass_ops_family(); CMakeLists.txt builds every family the same way, joining the family's
# generated instances and dispatch table (CUTLASS_OPS_GENERATED_<FAMILY>_*, instances.cmake).
#
#   cutlass_ops_family(<name>
#     OP       files   op entry points (schema, checks, CPU implementation): every build
#     CUDA     files   the op's CUDA side (torch-facing .cpp): CUDA builds
#     KERNELS  files   hand-written CUDA kernels without CUTLASS: compiled for every requested arch
#     DISPATCH files   torch-free dispatch code, in cutlass_ops_dispatch (also linked by the C++ tests)
#     SM90     files   hand-written sources compiled with the family's generated family-90
#                      instances (sm_90a flags), when the build has any
#     SM90_DISPATCH_DEFINES defs  compile definitions of cutlass_ops_dispatch when it has those
#     INCLUDES dirs    extra (system) include folders of the family's generated instances)
#
# File names are relative to the folder of the sources.cmake.  Sets CUTLASS_OPS_FAMILY_<name>_<KIND>
# and appends <name> to CUTLASS_OPS_FAMILIES.
function(cutlass_ops_family name)
  set(_files OP CUDA KERNELS DISPATCH SM90)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "${_files};SM90_DISPATCH_DEFINES;INCLUDES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "cutlass_ops_family(${name}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  foreach(kind IN LISTS _files)
    list(TRANSFORM arg_${kind} PREPEND "${CMAKE_CURRENT_LIST_DIR}/")
  endforeach()
  foreach(kind IN LISTS _files ITEMS SM90_DISPATCH_DEFINES INCLUDES)
    set(CUTLASS_OPS_FAMILY_${name}_${kind} "${arg_${kind}}" PARENT_SCOPE)
  endforeach()
  set(CUTLASS_OPS_FAMILIES ${CUTLASS_OPS_FAMILIES} ${name} PARENT_SCOPE)
endfunction()

set(CUTLASS_OPS_FAMILIES)
file(GLOB _family_lists CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/kernels/*/sources.cmake")
list(SORT _family_lists)
foreach(_family_list IN LISTS _family_lists)
  include("${_family_list}")
endforeach()
