// Entry points that run one generated FusedMLP source's kernels on the CPU emulator
// (cuda_emulate_prelude.h), with the parameters the real host side (mlp_emit's fmlp_fwd,
// fmlp_bwd, fmlp_bwd_dw) passes: the generated source's fwd_params / bwd_params /
// bwd_dw_params build them for both.  Built by tests/python/test_mlp_emulator.py:
//   g++ -DFMLP_EMULATE -DKERNEL_SOURCE='"model.cu"' [-DHAS_BWD_DW] -include cuda_emulate_prelude.h
// The grid is the caller's: streamed kernels need ceil(M / BM) CTAs, resident ones any number
// (a grid-stride loop).  Each returns 0, or 1 on a deadlock.
#include KERNEL_SOURCE

namespace fmlp_model {
alignas(16) unsigned char smem[232448];
}

extern "C" int emu_fwd(int save, const void* x, void* y, const void* const* w, const void* const* b, void* const* z,
                       void* const* a, long long M, unsigned grid, unsigned seed) {
  const FwdParams p = fwd_params(x, y, w, b, z, a, M, save);
  auto body = [&] {
    if (save)
      fwd_kernel<true>(p);
    else
      fwd_kernel<false>(p);
  };
  return cuda_emu::launch(body, grid, THREADS, fmlp_model::smem, SMEM_FWD, seed) ? 0 : 1;
}

extern "C" int emu_bwd(const void* dy, void* dx, const void* const* z, const void* const* w, void* const* dz,
                       void* const* db, long long M, unsigned grid, unsigned seed) {
  const BwdParams p = bwd_params(dy, dx, z, w, dz, db, M);
  return cuda_emu::launch([&] { bwd_kernel(p); }, grid, THREADS, fmlp_model::smem, SMEM_BWD, seed) ? 0 : 1;
}

#ifdef HAS_BWD_DW
extern "C" int emu_bwd_dw(const void* dy, void* dx, const void* x, const void* const* z, const void* const* a,
                          const void* const* w, void* const* dw, void* const* db, long long M, unsigned grid,
                          unsigned seed) {
  const BwdDwParams p = bwd_dw_params(dy, dx, x, z, a, w, dw, db, M);
  return cuda_emu::launch([&] { bwd_dw_kernel(p); }, grid, DW_WARPS * 32, fmlp_model::smem, SMEM_DW, seed) ? 0 : 1;
}
#endif
