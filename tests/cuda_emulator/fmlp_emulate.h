// The warp-collective instructions of mlp_kernel.cuh's PTX wrappers, on the CPU (included inside
// namespace fmlp when FMLP_EMULATE is defined; the machinery is cuda_emulate_prelude.h).  Each
// follows the PTX ISA's fragment layouts:
// - ldmatrix .m8n8 .x1/.x2/.x4 .b16: lanes 8i..8i+7 give the row addresses of matrix i; lane L
//   receives, of each matrix, row L/4, columns 2(L%4) and 2(L%4)+1 (with .trans: of the
//   transposed matrix, i.e. rows 2(L%4) and 2(L%4)+1 of column L/4).
// - mma.m16n8k16 .row.col, f32 += f16/bf16 x f16/bf16, g = L/4, t = L%4:
//   a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
//   b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; c0,c1 = D[g][2t..2t+1], c2,c3 = D[g+8][2t..].
// - cp.async: the copy lands at cp.async.wait_group (all but the newest N committed groups).

template <int NMAT, bool TRANS>
inline void emu_ldmatrix(uint32_t* r, const void* p) {
  cuda_emu::WarpSlots& s = cuda_emu::slots();
  const unsigned lane = cuda_emu::lane();
  s.addr[lane] = p;
  cuda_emu::sync_warp();
  for (int i = 0; i < NMAT; ++i) {
    uint16_t lo, hi;
    if (!TRANS) {
      const uint16_t* row = static_cast<const uint16_t*>(s.addr[i * 8 + lane / 4]);
      lo = row[2 * (lane % 4)];
      hi = row[2 * (lane % 4) + 1];
    } else {
      lo = static_cast<const uint16_t*>(s.addr[i * 8 + 2 * (lane % 4)])[lane / 4];
      hi = static_cast<const uint16_t*>(s.addr[i * 8 + 2 * (lane % 4) + 1])[lane / 4];
    }
    r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  cuda_emu::sync_warp();
}

inline void ldsm_x4(uint32_t* r, const void* p) { emu_ldmatrix<4, false>(r, p); }
inline void ldsm_x2(uint32_t* r, const void* p) { emu_ldmatrix<2, false>(r, p); }
inline void ldsm_x4_t(uint32_t* r, const void* p) { emu_ldmatrix<4, true>(r, p); }
inline void ldsm_x2_t(uint32_t* r, const void* p) { emu_ldmatrix<2, true>(r, p); }

template <class H, class H2>
inline void emu_mma(float* c, const uint32_t* a, const uint32_t* b, float2 (*to_float2)(H2)) {
  cuda_emu::WarpSlots& s = cuda_emu::slots();
  const unsigned lane = cuda_emu::lane();
  for (int i = 0; i < 4; ++i) s.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) s.b[lane][i] = b[i];
  cuda_emu::sync_warp();
  auto half_of = [&](uint32_t v, int hi) {
    H2 h2;
    std::memcpy(&h2, &v, 4);
    const float2 f = to_float2(h2);
    return hi ? f.y : f.x;
  };
  // A[m][k] and B[k][n] from the lanes' fragments
  auto A = [&](int m, int k) {
    const int g = m % 8, t = (k % 8) / 2, reg = (m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half_of(s.a[g * 4 + t][reg], k % 2);
  };
  auto B = [&](int k, int n) {
    const int t = (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    return half_of(s.b[n * 4 + t][reg], k % 2);
  };
  const int g = lane / 4, t = lane % 4;
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int m = g + (e >= 2 ? 8 : 0), n = 2 * t + (e % 2);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) acc += A(m, k) * B(k, n);
    d[e] = acc;
  }
  cuda_emu::sync_warp();
  for (int e = 0; e < 4; ++e) c[e] = d[e];
}

inline void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
  emu_mma<__half, __half2>(c, a, b, [](__half2 h) { return __half22float2(h); });
}
inline void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  emu_mma<__nv_bfloat16, __nv_bfloat162>(c, a, b, [](__nv_bfloat162 h) { return __bfloat1622float2(h); });
}

inline void cp_async16(void* smem, const void* gmem) {
  cuda_emu::Cta* c = cuda_emu::cta();
  c->fibers[c->current].open.copies.emplace_back(smem, gmem);
}
inline void cp_commit() {
  cuda_emu::Cta* c = cuda_emu::cta();
  cuda_emu::Fiber& f = c->fibers[c->current];
  f.committed.push_back(std::move(f.open));
  f.open = cuda_emu::CopyGroup();
}
template <int N>
inline void cp_wait() {
  cuda_emu::Cta* c = cuda_emu::cta();
  cuda_emu::Fiber& f = c->fibers[c->current];
  while ((int)f.committed.size() > N) {
    for (auto& cp : f.committed.front().copies) std::memcpy(cp.first, cp.second, 16);
    f.committed.erase(f.committed.begin());
  }
}
