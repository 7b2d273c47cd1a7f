// The draft's decode forward over its verification set as ONE persistent kernel (Hopper, bf16).
//
// Every layer of a Llama-family decoder (RMSNorm, fused qkv (+ bias), RoPE, the cache write,
// attention over an index set plus the forward's own tokens, wo, RMSNorm, gate|up + SwiGLU, w2) for
// ROWS = B * T <= 32 rows, one CTA per SM, the phases of a layer joined by grid barriers instead of
// kernel boundaries:
//
//   A  x = rms(R + h) (R: residual, h: w2's two fp32 halves), qkv = x @ Wqkv.T + b, RoPE,
//      q -> QALL[layer], k / v -> the cache rows lens[b] + t                  72 units of 16 columns
//   B  attention of the NREP * T query rows of each (b, g) over IDX[b] and the new rows (causal),
//      split over SPL CTAs, partials combined by the last CTA to arrive (ticket)  B * G * SPL units
//   C  R += attn @ Wo.T (+ bias)                                              HID / 8 units
//   D  act = silu(g) * u of rms(R) @ W13.T                                    INTER / 8 units
//   E  h = act @ W2.T, two K halves added into a zeroed fp32 buffer (two addends: order-free)
//
// Weights stream into a ring of NSLOT shared-memory slots through bulk copies (cp.async.bulk +
// mbarrier) issued by a producer warp (warp 7) that walks this CTA's static schedule of weight
// chunks across phases and layers, so the next phase's weights are in flight while the compute
// warps wait at a grid barrier. Activations come from L2 (cp.async.cg). Matrix products are
// mma.sync m16n8k16 bf16 -> fp32, K split over the 7 compute warps and summed in shared memory in
// a fixed order (deterministic). Roundings follow the Triton path (skinny.py, layer_ops.py,
// verify_attention.py): bf16 after each linear, norm as rms_norm_ref. PROF builds stamp clock64
// at every barrier for probes/probe_draft_megakernel.py.
//
// Compile-time shapes (-D): HID, NQ, NKV, HD (64), INTER, MT (row tiles of 16: 1 or 2), NSLOT,
// HAS_QKV_BIAS, HAS_O_BIAS. No headers: NVRTC compiles it as is.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define NBLOCK 256  // threads of a CTA: 7 compute warps and the weight producer (warp 7)
#define NTHR 224    // compute threads
#define NWARP 7     // compute warps

constexpr int NREP = NQ / NKV;
constexpr int OK = NQ * HD;                    // wo's K
constexpr int KH = INTER / 2;                  // w2's K half
constexpr int XK = HID > OK ? HID : OK;        // widest K staged whole (A, C, D)
constexpr int ECH = (KH + XK - 1) / XK;        // weight chunks per E unit
constexpr int CHK_E = ((KH + ECH - 1) / ECH + 15) / 16 * 16;
constexpr int WPITCH = XK + 8;                 // slot row pitch (elements); 16 rows per slot
constexpr int SLOT_ELEMS = 16 * WPITCH;
constexpr int RP = MT * 16;                    // padded rows
constexpr int XPITCH = XK + 8;
constexpr int EPITCH = CHK_E + 8;
constexpr int E_CPP_MAX = 40960 / (RP * EPITCH);  // E chunks whose activations are staged at once
constexpr int E_CPP = E_CPP_MAX < 1 ? 1 : (E_CPP_MAX > ECH ? ECH : E_CPP_MAX);
constexpr int KVP = HD + 8;                    // attention staging row pitch
constexpr int ATT_ELEMS = NWARP * 2 * 2 * 16 * KVP;  // per warp: 2 buffers x (K, V) x 16 rows
constexpr int COMB_FLOATS = NWARP * 16 * (HD + 2);
constexpr int XA = (RP + 1) * XPITCH, XE = RP * EPITCH * E_CPP, XC = COMB_FLOATS * 2;
constexpr int XREGION = (XA > XE ? XA : XE) > (ATT_ELEMS > XC ? ATT_ELEMS : XC)
                            ? (XA > XE ? XA : XE) : (ATT_ELEMS > XC ? ATT_ELEMS : XC);  // elements (bf16)
constexpr int RED_FLOATS = NWARP * RP * 16;
constexpr int KIDX_MAX = 1024;  // the first attention unit's index rows, kept in shared memory
constexpr int UNITS_A = (NQ + 2 * NKV) * (HD / 16);
constexpr int UNITS_C = HID / 8;
constexpr int UNITS_D = INTER / 8;
constexpr int UNITS_E = (HID / 16) * 2;
constexpr float NEG_BIG = -1.0e30f;
#define NEG_INF __int_as_float(0xff800000)

static_assert(HD == 64, "head_dim 64 only");
static_assert(HID % 16 == 0 && OK % 16 == 0 && INTER % 32 == 0 && KH % 16 == 0, "shapes must be multiples of 16");
static_assert(CHK_E <= XK, "E chunk wider than a slot");
static_assert(RED_FLOATS >= RP * ((HID + 63) / 64), "the reduction buffer holds the norm's row slices");
static_assert(XREGION >= (RP + 1) * XPITCH, "the staging region holds the rows and a norm weight row");

// per layer pointer table (u64 each)
enum { P_WQKV, P_BQKV, P_WO, P_BO, P_W13, P_W2, P_N1, P_N2, P_K, P_V, NPTR };

struct Params {
  const u64* ptrs;      // [L][NPTR]
  u16* r0;              // [ROWS][HID] residual in (embeddings); ping
  u16* r1;              // pong
  float* hsum;          // [ROWS][HID] w2's output, fp32 (the two halves added)
  u16* qall;            // [L][B][NQ][T][HD]
  u16* attn;            // [ROWS][OK]
  u16* act;             // [ROWS][INTER]
  float* pacc;          // [B*NKV*SPL][16][HD]
  float* pml;           // [B*NKV*SPL][2][16]
  u32* tickets;         // [B*NKV], zero between launches
  u32* bar;             // [2]: arrivals, exits; zero between launches
  const int* idx;       // [B][NI] int32, -1 = none
  const int* lens;      // [B] int32: new token t of sequence b sits at row lens[b] + t
  const float* rope;    // [2][NR][HD]
  long long nmax;       // cache rows per (b, g)
  int ni, nr, B, T, rows, nlayers, spl;
  float eps, qk_scale;  // qk_scale = log2(e) / sqrt(HD)
  u64* prof;            // PROF builds: [grid][L][16] clock64 at each barrier's arrival and release (0-9) and inside phases (10-15)
};

// ---------------------------------------------------------------- small helpers
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ float bf2f(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ u32 pack2(float lo, float hi) {  // two floats to bf16 (round to nearest even)
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 f2bf(float f) { return pack2(f, 0.f) & 0xffffu; }
__device__ __forceinline__ float rbf(float f) { return bf2f(f2bf(f)); }
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ u32 lds32(const u16* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ float ldcg_f(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldcg_u16(const u16* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldcg_u32(const void* p) {
  u32 v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// mbarrier + bulk copies (the weight ring)
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Every spin is bounded: a wait that outlives 2^24 polls (~10 s) traps (a launch error, not a hang).
__device__ __forceinline__ void spin_guard(u32& n) {
  if (++n > (1u << 24)) asm volatile("trap;");
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  u32 done = 0, n = 0;
  while (!done) {
    spin_guard(n);
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// the compute warps' barrier (named barrier 1; the producer warp never joins it)
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(NTHR) : "memory"); }
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// grid barrier: a monotonic arrival counter (zeroed by the last CTA to exit)
__device__ __forceinline__ void grid_sync(u32* count, u32& epoch) {
  csync();
  if (threadIdx.x == 0) {
    epoch += 1;
    const u32 target = epoch * gridDim.x;
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    u32 v, n = 0;
    do {
      spin_guard(n);
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
  }
  csync();
}

// ---------------------------------------------------------------- the weight schedule
// Phase p of a layer: 0 = A (qkv), 1 = C (wo), 2 = D (gate|up), 3 = E (w2). A CTA takes units
// blockIdx.x, blockIdx.x + gridDim.x, ...; a unit is one chunk, except E's (ECH chunks).
__device__ __forceinline__ int units_of(int p) {
  return p == 0 ? UNITS_A : p == 1 ? UNITS_C : p == 2 ? UNITS_D : UNITS_E;
}
__device__ __forceinline__ int chunks_of(int p) { return p == 3 ? ECH : 1; }

struct Cursor {
  int layer, phase, unit, j;
};

__device__ __forceinline__ void cursor_settle(Cursor& c, int nlayers) {  // skip phases with no unit here
  while (c.layer < nlayers && c.unit >= units_of(c.phase)) {
    c.phase += 1;
    c.unit = blockIdx.x;
    c.j = 0;
    if (c.phase == 4) {
      c.phase = 0;
      c.layer += 1;
    }
  }
}
__device__ __forceinline__ void cursor_next(Cursor& c, int nlayers) {
  c.j += 1;
  if (c.j == chunks_of(c.phase)) {
    c.j = 0;
    c.unit += gridDim.x;
  }
  cursor_settle(c, nlayers);
}

// Rows of the chunk: row i (< nrows) of the slot is weight row wrow(i); K range [k0, k0 + klen).
struct Chunk {
  const u16* w;
  int ldw, nrows, k0, klen, row0, row1;  // rows: row0 + i for i < 8, row1 + i - 8 for i >= 8
};

__device__ __forceinline__ Chunk chunk_of(const Params& p, const Cursor& c) {
  const u64* t = p.ptrs + (u64)c.layer * NPTR;
  Chunk k;
  if (c.phase == 0) {
    const int hh = c.unit / (HD / 16), w = c.unit % (HD / 16);
    k.w = (const u16*)t[P_WQKV]; k.ldw = HID; k.nrows = 16; k.k0 = 0; k.klen = HID;
    k.row0 = hh * HD + 8 * w; k.row1 = hh * HD + HD / 2 + 8 * w;
  } else if (c.phase == 1) {
    k.w = (const u16*)t[P_WO]; k.ldw = OK; k.nrows = 8; k.k0 = 0; k.klen = OK;
    k.row0 = 8 * c.unit; k.row1 = 0;
  } else if (c.phase == 2) {
    k.w = (const u16*)t[P_W13]; k.ldw = HID; k.nrows = 16; k.k0 = 0; k.klen = HID;
    k.row0 = 8 * c.unit; k.row1 = INTER + 8 * c.unit;
  } else {
    const int ct = c.unit >> 1, kh = c.unit & 1;
    k.w = (const u16*)t[P_W2]; k.ldw = INTER; k.nrows = 16;
    k.k0 = kh * KH + c.j * CHK_E;
    k.klen = imin(CHK_E, KH - c.j * CHK_E);
    k.row0 = 16 * ct; k.row1 = 16 * ct + 8;
  }
  return k;
}

// Warp 0 issues one chunk into `slot` (lane 0 arms the barrier first).
__device__ __forceinline__ void issue_chunk(const Params& p, const Cursor& c, u16* slot, u64* bar) {
  const int lane = threadIdx.x & 31;
  const Chunk k = chunk_of(p, c);
  if (lane == 0) mbar_expect(bar, (u32)(k.nrows * k.klen * 2));
  __syncwarp();
  if (lane < k.nrows) {
    const int row = lane < 8 ? k.row0 + lane : k.row1 + lane - 8;
    bulk_copy(slot + lane * WPITCH, k.w + (u64)row * k.ldw + k.k0, (u32)(k.klen * 2), bar);
  }
}

struct Ring {
  u16* slots;
  u64* full;    // [NSLOT]: the producer arms it, the bulk copies complete it
  u64* empty;   // [NSLOT]: compute thread 0 arrives once every compute warp is done with the slot
  u32 consumed;
};

// The producer warp: every chunk of this CTA's schedule, in order, as soon as its slot is free.
__device__ void produce(const Params& p, u16* slots, u64* full, u64* empty) {
  Cursor c;
  c.layer = 0; c.phase = 0; c.unit = blockIdx.x; c.j = 0;
  cursor_settle(c, p.nlayers);
  for (u32 k = 0; c.layer < p.nlayers; ++k) {
    const u32 s = k % NSLOT;
    if (k >= NSLOT) mbar_wait(empty + s, ((k / NSLOT) - 1) & 1u);
    if ((threadIdx.x & 31) == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    issue_chunk(p, c, slots + (u64)s * SLOT_ELEMS, full + s);
    cursor_next(c, p.nlayers);
  }
}
__device__ __forceinline__ const u16* ring_wait(Ring& r) {
  const u32 s = r.consumed % NSLOT;
  mbar_wait(r.full + s, (r.consumed / NSLOT) & 1u);
  return r.slots + (u64)s * SLOT_ELEMS;
}
__device__ __forceinline__ void ring_release(Ring& r) {  // once every compute warp is done with the slot
  csync();
  if (threadIdx.x == 0) mbar_arrive(r.empty + r.consumed % NSLOT);
  r.consumed += 1;
}

// ---------------------------------------------------------------- matrix pieces
// acc[MT][NT][4] += X[:, xk0 + k-steps of this warp] @ W_slot[:, kk].T over `klen` columns.
template <int NT>
__device__ __forceinline__ void mma_chunk(float (*acc)[2][4], const u16* X, int xpitch, int xk0, const u16* W,
                                          int klen) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int steps = klen / 16;
  const int s0 = steps * warp / NWARP, s1 = steps * (warp + 1) / NWARP;
  for (int s = s0; s < s1; ++s) {
    const int kx = xk0 + s * 16 + 2 * tg, kw = s * 16 + 2 * tg;
    u32 b[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const u16* wr = W + (nt * 8 + g) * WPITCH + kw;
      b[nt][0] = lds32(wr);
      b[nt][1] = lds32(wr + 8);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const u16* xr = X + (mt * 16 + g) * xpitch + kx;
      const u32 a0 = lds32(xr), a1 = lds32(xr + 8 * xpitch), a2 = lds32(xr + 8), a3 = lds32(xr + 8 * xpitch + 8);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma(acc[mt][nt], a0, a1, a2, a3, b[nt][0], b[nt][1]);
    }
  }
}

// The warps' partial sums into red[warp][row][col] (col < 16).
template <int NT>
__device__ __forceinline__ void red_store(float* red, float (*acc)[2][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  float* rw = red + warp * RP * 16;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = mt * 16 + g, c = nt * 8 + 2 * tg;
      rw[r * 16 + c] = acc[mt][nt][0];
      rw[r * 16 + c + 1] = acc[mt][nt][1];
      rw[(r + 8) * 16 + c] = acc[mt][nt][2];
      rw[(r + 8) * 16 + c + 1] = acc[mt][nt][3];
    }
}
__device__ __forceinline__ float red_sum(const float* red, int r, int c) {
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < NWARP; ++w) s += red[(w * RP + r) * 16 + c];
  return s;
}
template <int NT>
__device__ __forceinline__ void acc_zero(float (*acc)[2][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
}

// Stage rows [RP][K] of a [rows][ld] bf16 matrix (columns [k0, k0 + K)) into X (pitch xp); zero padding rows.
__device__ __forceinline__ void stage(u16* X, int xp, const u16* src, int ld, int k0, int K, int rows) {
  const int per = K / 8;
  for (int i = threadIdx.x; i < RP * per; i += NTHR) {
    const int r = i / per, c = (i % per) * 8;
    const bool ok = r < rows;
    cp16(X + r * xp + c, src + (u64)(ok ? r : 0) * ld + k0 + c, ok);
  }
}

// x = R (+ bf16(hsum)) staged in X; CTA 0 writes it to Rout; then X = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))).
struct __align__(16) v16 {  // 8 bf16
  u32 x, y, z, w;
};
__device__ __forceinline__ float sq2(u32 v) {
  const float a = bf2f(v & 0xffffu), b = bf2f(v >> 16);
  return a * a + b * b;
}
__device__ __forceinline__ u32 nrm2(u32 x, u32 w, float iv) {  // bf16(w * bf16(x * iv)), two at a time
  return pack2(bf2f(w & 0xffffu) * rbf(bf2f(x & 0xffffu) * iv), bf2f(w >> 16) * rbf(bf2f(x >> 16) * iv));
}

// scratch: RP * ceil(HID / 64) floats (the reduction buffer, free between the phases' products)
__device__ void norm_stage(const Params& p, u16* X, float* inv, const u16* R, const float* hsum, u16* Rout,
                           const u16* nw, float* scratch) {
  stage(X, XPITCH, R, HID, 0, HID, p.rows);
  u16* ws = X + RP * XPITCH;  // the norm weight, staged beside the rows (row RP of the region)
  for (int i = threadIdx.x; i < HID / 8; i += NTHR) cp16(ws + 8 * i, nw + 8 * i, true);
  cp_commit();
  cp_wait_all();
  csync();
  if (hsum != nullptr) {  // x = bf16(x + bf16(h)): 4 elements a load, UNR loads in flight per thread
    constexpr int UNR = 8;
    const int n4 = p.rows * HID / 4;
    for (int base = threadIdx.x; base < n4; base += NTHR * UNR) {
      float v[UNR][4];
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        const int i = base + u * NTHR;
        if (i < n4) {
          asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                       : "=f"(v[u][0]), "=f"(v[u][1]), "=f"(v[u][2]), "=f"(v[u][3]) : "l"(hsum + 4 * i));
        }
      }
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        const int i = base + u * NTHR;
        if (i < n4) {
          const int r = (4 * i) / HID, c = (4 * i) % HID;
          u32* xp = reinterpret_cast<u32*>(X + r * XPITCH + c);
          const u32 a = xp[0], b = xp[1];
          xp[0] = pack2(bf2f(a & 0xffffu) + rbf(v[u][0]), bf2f(a >> 16) + rbf(v[u][1]));
          xp[1] = pack2(bf2f(b & 0xffffu) + rbf(v[u][2]), bf2f(b >> 16) + rbf(v[u][3]));
        }
      }
    }
    csync();
  }
  constexpr int V8 = HID / 8;  // 16-byte vectors of a row
  if (blockIdx.x == 0 && Rout != nullptr) {
    for (int i = threadIdx.x; i < p.rows * V8; i += NTHR) {
      const int r = i / V8, c = 8 * (i % V8);
      *reinterpret_cast<v16*>(Rout + r * HID + c) = *reinterpret_cast<const v16*>(X + r * XPITCH + c);
    }
  }
  // row sums of squares: every thread a (row, 64 columns) slice, then each row's slices in order
  constexpr int CH = (HID + 63) / 64;
  for (int i = threadIdx.x; i < RP * CH; i += NTHR) {
    const int r = i / CH, c0 = 64 * (i % CH);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (c0 + 8 * k < HID) {
        const v16 v = *reinterpret_cast<const v16*>(X + r * XPITCH + c0 + 8 * k);
        s += sq2(v.x) + sq2(v.y) + sq2(v.z) + sq2(v.w);
      }
    }
    scratch[i] = s;
  }
  csync();
  if (threadIdx.x < RP) {
    float s = 0.f;
    for (int c = 0; c < CH; ++c) s += scratch[threadIdx.x * CH + c];
    inv[threadIdx.x] = rsqrtf(s / HID + p.eps);
  }
  csync();
  const int nv = p.rows * V8;
#pragma unroll 4
  for (int i = threadIdx.x; i < nv; i += NTHR) {
    const int r = i / V8, c = 8 * (i % V8);
    v16* xp = reinterpret_cast<v16*>(X + r * XPITCH + c);
    const v16 x = *xp, w = *reinterpret_cast<const v16*>(ws + c);
    const float iv = inv[r];
    v16 o;
    o.x = nrm2(x.x, w.x, iv);
    o.y = nrm2(x.y, w.y, iv);
    o.z = nrm2(x.z, w.z, iv);
    o.w = nrm2(x.w, w.w, iv);
    *xp = o;
  }
  csync();
}

// ---------------------------------------------------------------- phase B: attention
__device__ __forceinline__ int split_rows(const Params& p) { return ((p.ni + p.spl - 1) / p.spl + 15) / 16 * 16; }

__device__ void attention_unit(const Params& p, int layer, int unit, u16* XS, float* misc, const int* kidx) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int pair = unit / p.spl, s = unit % p.spl;
  const int b = pair / NKV, kvh = pair % NKV;
  const int T = p.T;
  const u64* tp = p.ptrs + (u64)layer * NPTR;
  const u16* kc = (const u16*)tp[P_K] + ((u64)b * NKV + kvh) * p.nmax * HD;
  const u16* vc = (const u16*)tp[P_V] + ((u64)b * NKV + kvh) * p.nmax * HD;
  const int L = p.lens[b];
  const int ch = split_rows(p);
  const int lo = imin(s * ch, p.ni), hi = imin(lo + ch, p.ni);
  const int nctx = hi - lo;
  const bool cached = unit == (int)blockIdx.x && nctx <= KIDX_MAX;
  const int nv = nctx + (s == 0 ? T : 0);
  const int nb = (nv + 15) / 16;

  // queries: row r = hl * T + t (hl < NREP), A fragments for the 4 k-steps of HD = 64
  u32 qa[4][4];
  {
    const u16* qb = p.qall + (((u64)layer * p.B + b) * NQ + (u64)kvh * NREP) * T * HD;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      const bool ok = r < NREP * T;
      const u16* qr = qb + (u64)(ok ? r : 0) * HD;  // [hl][t] rows are consecutive: (hl * T + t) * HD
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        qa[kk][half] = ok ? ldcg_u32(qr + kk * 16 + 2 * tg) : 0u;
        qa[kk][half + 2] = ok ? ldcg_u32(qr + kk * 16 + 8 + 2 * tg) : 0u;
      }
    }
  }
  const int t_lo = g % T, t_hi = (g + 8) % T;  // the query rows' token index

  u16* kb = XS + warp * (2 * 2 * 16 * KVP);  // 2 buffers x (K 16 rows, V 16 rows)
  float m_lo = NEG_BIG, m_hi = NEG_BIG, l_lo = 0.f, l_hi = 0.f;
  float o[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  // key v of this split: context row IDX[b][lo + v] or new token j = v - nctx at row L + j
  auto key_of = [&](int v, int& row, int& j) {
    if (v < nctx) {
      row = cached ? kidx[v] : p.idx[(u64)b * p.ni + lo + v];
      j = -1;
    } else if (v < nv) {
      j = v - nctx;
      row = L + j;
    } else {
      row = -1;
      j = -1;
    }
  };
  auto load_block = [&](int blk, int buf) {
    int row, j;
    key_of(blk * 16 + (lane & 15), row, j);
    u16* K = kb + buf * (2 * 16 * KVP);
    u16* V = K + 16 * KVP;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 16 rows x 8 pieces of 16 B, K and V: 8 pieces per lane each... 4 + 4
      const int piece = lane + 32 * i;           // 0..127
      const int rr = piece >> 3, cc = (piece & 7) * 8;
      const int rrow = __shfl_sync(0xffffffffu, row, rr);
      const bool ok = rrow >= 0;
      cp16(K + rr * KVP + cc, kc + (u64)(ok ? rrow : 0) * HD + cc, ok);
      cp16(V + rr * KVP + cc, vc + (u64)(ok ? rrow : 0) * HD + cc, ok);
    }
    cp_commit();
  };

  int buf = 0;
  if (warp < nb) load_block(warp, 0);
  for (int blk = warp; blk < nb; blk += NWARP) {
    const bool more = blk + NWARP < nb;
    if (more) load_block(blk + NWARP, buf ^ 1);
    if (more) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else cp_wait_all();
    __syncwarp();
    const u16* K = kb + buf * (2 * 16 * KVP);
    const u16* V = K + 16 * KVP;
    int row, j;
    key_of(blk * 16 + (lane & 15), row, j);
    // S = Q K^T: 16 query rows x 16 keys (2 n-tiles)
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const u16* kr = K + (nt * 8 + g) * KVP + kk * 16 + 2 * tg;
        mma(sc[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], lds32(kr), lds32(kr + 8));
      }
    }
    // mask and scale; this thread's columns: nt * 8 + 2 tg + e
    float mx_lo = NEG_BIG, mx_hi = NEG_BIG;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * 8 + 2 * tg + e;
        const int krow = __shfl_sync(0xffffffffu, row, col), kj = __shfl_sync(0xffffffffu, j, col);
        const bool ok_lo = krow >= 0 && (kj < 0 || kj <= t_lo);
        const bool ok_hi = krow >= 0 && (kj < 0 || kj <= t_hi);
        sc[nt][e] = ok_lo ? sc[nt][e] * p.qk_scale : NEG_INF;
        sc[nt][2 + e] = ok_hi ? sc[nt][2 + e] * p.qk_scale : NEG_INF;
        mx_lo = fmaxf(mx_lo, sc[nt][e]);
        mx_hi = fmaxf(mx_hi, sc[nt][2 + e]);
      }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
    }
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float al_lo = exp2f(m_lo - mn_lo), al_hi = exp2f(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float pr[2][4];
    float rs_lo = 0.f, rs_hi = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        pr[nt][e] = exp2f(sc[nt][e] - mn_lo);
        pr[nt][2 + e] = exp2f(sc[nt][2 + e] - mn_hi);
        rs_lo += pr[nt][e];
        rs_hi += pr[nt][2 + e];
      }
    l_lo = l_lo * al_lo + rs_lo;
    l_hi = l_hi * al_hi + rs_hi;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) {
      o[dt][0] *= al_lo; o[dt][1] *= al_lo; o[dt][2] *= al_hi; o[dt][3] *= al_hi;
    }
    // P as the A operand (rounded to bf16 like the Triton kernel's p.to(DT))
    const u32 a0 = pack2(pr[0][0], pr[0][1]), a1 = pack2(pr[0][2], pr[0][3]);
    const u32 a2 = pack2(pr[1][0], pr[1][1]), a3 = pack2(pr[1][2], pr[1][3]);
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) {
      const int d = dt * 8 + g;
      const u32 b0 = (u32)V[(2 * tg) * KVP + d] | ((u32)V[(2 * tg + 1) * KVP + d] << 16);
      const u32 b1 = (u32)V[(2 * tg + 8) * KVP + d] | ((u32)V[(2 * tg + 9) * KVP + d] << 16);
      mma(o[dt], a0, a1, a2, a3, b0, b1);
    }
    __syncwarp();
    buf ^= 1;
  }
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  csync();  // every warp is done with its K / V staging: reuse XS as float partials
  float* comb = reinterpret_cast<float*>(XS);  // [warp][16][HD + 2]: acc, m, l
  {
    float* cw = comb + warp * 16 * (HD + 2);
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) {
      const int d = dt * 8 + 2 * tg;
      cw[g * (HD + 2) + d] = o[dt][0];
      cw[g * (HD + 2) + d + 1] = o[dt][1];
      cw[(g + 8) * (HD + 2) + d] = o[dt][2];
      cw[(g + 8) * (HD + 2) + d + 1] = o[dt][3];
    }
    if (tg == 0) {
      cw[g * (HD + 2) + HD] = m_lo;
      cw[g * (HD + 2) + HD + 1] = l_lo;
      cw[(g + 8) * (HD + 2) + HD] = m_hi;
      cw[(g + 8) * (HD + 2) + HD + 1] = l_hi;
    }
  }
  csync();
  // combine the warps (fixed order); cell e -> (row r = e / 16, columns c0 = 4 (e % 16) ..)
  for (int e = threadIdx.x; e < 256; e += NTHR) {
    const int r = e >> 4, c0 = (e & 15) * 4;
    float M = NEG_BIG;
#pragma unroll
    for (int w = 0; w < NWARP; ++w) M = fmaxf(M, comb[(w * 16 + r) * (HD + 2) + HD]);
    float Lsum = 0.f, A[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < NWARP; ++w) {
      const float* cw = comb + (w * 16 + r) * (HD + 2);
      const float f = exp2f(cw[HD] - M);
      Lsum += cw[HD + 1] * f;
#pragma unroll
      for (int i = 0; i < 4; ++i) A[i] += cw[c0 + i] * f;
    }
    if (p.spl == 1) {
      if (r < NREP * T) {
        u16* orow = p.attn + (u64)(b * T + r % T) * OK + (u64)(kvh * NREP + r / T) * HD;
        const float il = Lsum > 0.f ? 1.f / Lsum : 0.f;
        *reinterpret_cast<u32*>(orow + c0) = pack2(A[0] * il, A[1] * il);
        *reinterpret_cast<u32*>(orow + c0 + 2) = pack2(A[2] * il, A[3] * il);
      }
    } else {
      float* pa = p.pacc + ((u64)unit * 16 + r) * HD + c0;
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[i] = A[i];
      if ((e & 15) == 0) {
        p.pml[(u64)unit * 32 + r] = M;
        p.pml[(u64)unit * 32 + 16 + r] = Lsum;
      }
    }
  }
  csync();
  if (p.spl == 1) return;
  u32* flag = reinterpret_cast<u32*>(misc);
  if (threadIdx.x == 0) {
    u32 old;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(p.tickets + pair) : "memory");
    *flag = old;
  }
  csync();
  if (*flag == (u32)(p.spl - 1)) {  // last to arrive: combine the splits in order (every load first)
    for (int e = threadIdx.x; e < 256; e += NTHR) {
      const int r = e >> 4, c0 = (e & 15) * 4;
      constexpr int SMAX = 8;
      float ms[SMAX], ls[SMAX], as[SMAX][4];
#pragma unroll
      for (int q = 0; q < SMAX; ++q) {
        if (q < p.spl) {
          const u64 uq = (u64)(pair * p.spl + q);
          ms[q] = ldcg_f(p.pml + uq * 32 + r);
          ls[q] = ldcg_f(p.pml + uq * 32 + 16 + r);
          asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                       : "=f"(as[q][0]), "=f"(as[q][1]), "=f"(as[q][2]), "=f"(as[q][3])
                       : "l"(p.pacc + (uq * 16 + r) * HD + c0));
        }
      }
      float Mr = NEG_BIG;
#pragma unroll
      for (int q = 0; q < SMAX; ++q)
        if (q < p.spl) Mr = fmaxf(Mr, ms[q]);
      float Lr = 0.f, Ar[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < SMAX; ++q) {
        if (q < p.spl) {
          const float f = exp2f(ms[q] - Mr);
          Lr += ls[q] * f;
#pragma unroll
          for (int i = 0; i < 4; ++i) Ar[i] += as[q][i] * f;
        }
      }
      if (r < NREP * T) {
        u16* orow = p.attn + (u64)(b * T + r % T) * OK + (u64)(kvh * NREP + r / T) * HD;
        const float il = Lr > 0.f ? 1.f / Lr : 0.f;
        *reinterpret_cast<u32*>(orow + c0) = pack2(Ar[0] * il, Ar[1] * il);
        *reinterpret_cast<u32*>(orow + c0 + 2) = pack2(Ar[2] * il, Ar[3] * il);
      }
    }
    if (threadIdx.x == 0) p.tickets[pair] = 0u;
  }
  csync();
}

#ifndef PROF
#define PROF 0
#endif
__device__ __forceinline__ void stamp(const Params& p, int layer, int k) {
#if PROF
  if (threadIdx.x == 0) p.prof[((u64)blockIdx.x * p.nlayers + layer) * 16 + k] = clock64();
#endif
}
__device__ __forceinline__ void phase_end(const Params& p, int layer, int ph, u32& epoch) {
  csync();
  stamp(p, layer, 2 * ph);
  grid_sync(p.bar, epoch);
  stamp(p, layer, 2 * ph + 1);
}

// ---------------------------------------------------------------- the kernel
extern "C" __global__ void __launch_bounds__(NBLOCK, 1) draft_forward_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  u16* slots = reinterpret_cast<u16*>(smem);
  u16* XS = slots + NSLOT * SLOT_ELEMS;
  float* red = reinterpret_cast<float*>(XS + XREGION);
  float* inv = red + RED_FLOATS;  // [RP]
  float* misc = inv + RP;         // [4]
  u64* full = reinterpret_cast<u64*>(misc + 4);
  u64* empty = full + NSLOT;
  int* kidx = reinterpret_cast<int*>(empty + NSLOT);  // [KIDX_MAX]
  float* rope_s = reinterpret_cast<float*>(kidx + KIDX_MAX);  // [RP][2][HD]: cos | sin at each row's position
  int* pos_s = reinterpret_cast<int*>(rope_s + RP * 2 * HD);  // [RP]

  if (threadIdx.x == 0) {
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= NTHR) {  // warp 7: the weight producer, then done
    produce(p, slots, full, empty);
    return;
  }
  Ring ring;
  ring.slots = slots;
  ring.full = full;
  ring.empty = empty;
  ring.consumed = 0;
  if ((int)blockIdx.x < p.B * NKV * p.spl) {  // this CTA's first attention unit: its index rows
    const int pair = blockIdx.x / p.spl, s = blockIdx.x % p.spl, b = pair / NKV;
    const int lo = imin(s * split_rows(p), p.ni), hi = imin(lo + split_rows(p), p.ni);
    for (int v = threadIdx.x; v < imin(hi - lo, KIDX_MAX); v += NTHR) kidx[v] = p.idx[(u64)b * p.ni + lo + v];
  }
  for (int i = threadIdx.x; i < RP * HD; i += NTHR) {  // the rows' positions and RoPE rows
    const int r = i / HD, d = i % HD;
    const int pos = r < p.rows ? p.lens[r / p.T] + r % p.T : 0;
    if (d == 0) pos_s[r] = pos;
    rope_s[(r * 2) * HD + d] = p.rope[(u64)pos * HD + d];
    rope_s[(r * 2 + 1) * HD + d] = p.rope[((u64)p.nr + pos) * HD + d];
  }
  csync();
  u32 epoch = 0;

  for (int layer = 0; layer < p.nlayers; ++layer) {
    const u64* tp = p.ptrs + (u64)layer * NPTR;
    u16* Rin = (layer & 1) ? p.r1 : p.r0;
    u16* Rout = (layer & 1) ? p.r0 : p.r1;
    // ---- A: norm, qkv, RoPE, cache write
    if ((int)blockIdx.x < UNITS_A) {
      norm_stage(p, XS, inv, Rin, layer > 0 ? p.hsum : nullptr, Rout, (const u16*)tp[P_N1], red);
#if HAS_QKV_BIAS
      const u16* bq = (const u16*)tp[P_BQKV];
#endif
      stamp(p, layer, 10);
      for (int u = blockIdx.x; u < UNITS_A; u += gridDim.x) {
        const int hh = u / (HD / 16), w = u % (HD / 16);
        float bias0 = 0.f, bias1 = 0.f;  // loaded before the matrix product needs them
#if HAS_QKV_BIAS
        bias0 = bf2f(bq[hh * HD + 8 * w + (threadIdx.x & 7)]);
        bias1 = bf2f(bq[hh * HD + HD / 2 + 8 * w + (threadIdx.x & 7)]);
#endif
        const u16* W = ring_wait(ring);
        float acc[MT][2][4];
        acc_zero<2>(acc);
        mma_chunk<2>(acc, XS, XPITCH, 0, W, HID);
        red_store<2>(red, acc);
        ring_release(ring);  // (its barrier also orders red)
        stamp(p, layer, 11);
        for (int i = threadIdx.x; i < p.rows * 8; i += NTHR) {  // NTHR % 8 == 0: jj = threadIdx.x & 7
          const int r = i >> 3, jj = i & 7;
          const int d0 = 8 * w + jj, d1 = HD / 2 + 8 * w + jj;
          float y0 = rbf(red_sum(red, r, jj) + bias0), y1 = rbf(red_sum(red, r, 8 + jj) + bias1);
          const int b = r / p.T, t = r % p.T;
          const int pos = pos_s[r];
          if (hh < NQ + NKV) {  // q or k: RoPE
            const float* cs = rope_s + (r * 2) * HD;
            const float* sn = cs + HD;
            const float o0 = y0 * cs[d0] - y1 * sn[d0];
            const float o1 = y1 * cs[d1] + y0 * sn[d1];
            y0 = o0;
            y1 = o1;
          }
          u16* dst;
          if (hh < NQ) {
            dst = p.qall + ((((u64)layer * p.B + b) * NQ + hh) * p.T + t) * HD;
          } else {
            const int kv = hh < NQ + NKV ? hh - NQ : hh - NQ - NKV;
            u16* cache = (u16*)(hh < NQ + NKV ? tp[P_K] : tp[P_V]);
            dst = cache + (((u64)b * NKV + kv) * p.nmax + pos) * HD;
          }
          dst[d0] = (u16)f2bf(y0);
          dst[d1] = (u16)f2bf(y1);
        }
        csync();  // red is read above: the next unit writes it
      }
    }
    phase_end(p, layer, 0, epoch);
    // ---- B: attention; zero hsum (read by A above) for this layer's E
    {
      const int n = p.rows * HID;
      const int per = (n + gridDim.x - 1) / gridDim.x;
      for (int i = blockIdx.x * per + threadIdx.x; i < imin(n, (int)(blockIdx.x + 1) * per); i += NTHR) p.hsum[i] = 0.f;
      const int units = p.B * NKV * p.spl;
      for (int u = blockIdx.x; u < units; u += gridDim.x) attention_unit(p, layer, u, XS, misc, kidx);
    }
    phase_end(p, layer, 1, epoch);
    // ---- C: R += attn @ Wo.T
    if ((int)blockIdx.x < UNITS_C) {
      stage(XS, XPITCH, p.attn, OK, 0, OK, p.rows);
      cp_commit();
      cp_wait_all();
      csync();
#if HAS_O_BIAS
      const u16* bo = (const u16*)tp[P_BO];
#endif
      stamp(p, layer, 15);
      for (int u = blockIdx.x; u < UNITS_C; u += gridDim.x) {
        constexpr int PER = (RP * 8 + NTHR - 1) / NTHR;
        float rv[PER];  // this thread's residual elements, loaded before the product needs them
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = threadIdx.x + k * NTHR;
          rv[k] = i < p.rows * 8 ? bf2f(ldcg_u16(Rout + (u64)(i >> 3) * HID + 8 * u + (i & 7))) : 0.f;
        }
        const u16* W = ring_wait(ring);
        float acc[MT][2][4];
        acc_zero<1>(acc);
        mma_chunk<1>(acc, XS, XPITCH, 0, W, OK);
        red_store<1>(red, acc);
        ring_release(ring);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = threadIdx.x + k * NTHR;
          if (i < p.rows * 8) {
            const int r = i >> 3, c = 8 * u + (i & 7);
            float y = red_sum(red, r, i & 7);
#if HAS_O_BIAS
            y += bf2f(bo[c]);
#endif
            Rout[(u64)r * HID + c] = (u16)f2bf(rv[k] + rbf(y));
          }
        }
        csync();
      }
    }
    phase_end(p, layer, 2, epoch);
    // ---- D: act = SwiGLU(rms(R) @ W13.T)
    if ((int)blockIdx.x < UNITS_D) {
      norm_stage(p, XS, inv, Rout, nullptr, nullptr, (const u16*)tp[P_N2], red);
      stamp(p, layer, 12);
      for (int u = blockIdx.x; u < UNITS_D; u += gridDim.x) {
        const u16* W = ring_wait(ring);
        float acc[MT][2][4];
        acc_zero<2>(acc);
        mma_chunk<2>(acc, XS, XPITCH, 0, W, HID);
        red_store<2>(red, acc);
        ring_release(ring);
        for (int i = threadIdx.x; i < p.rows * 8; i += NTHR) {
          const int r = i >> 3, jj = i & 7;
          const float gt = rbf(red_sum(red, r, jj)), up = rbf(red_sum(red, r, 8 + jj));
          const float sl = rbf(gt / (1.f + expf(-gt)));
          p.act[(u64)r * INTER + 8 * u + jj] = (u16)f2bf(sl * up);
        }
        csync();
      }
    }
    phase_end(p, layer, 3, epoch);
    // ---- E: hsum += act[:, K half] @ W2[cols, K half].T
    if ((int)blockIdx.x < UNITS_E) {
      for (int u = blockIdx.x; u < UNITS_E; u += gridDim.x) {
        const int ct = u >> 1, kh = u & 1;
        float acc[MT][2][4];
        acc_zero<2>(acc);
        for (int j0 = 0; j0 < ECH; j0 += E_CPP) {
          const int jn = imin(E_CPP, ECH - j0);
          for (int jj = 0; jj < jn; ++jj) {
            const int kc = (j0 + jj) * CHK_E;
            stage(XS + jj * RP * EPITCH, EPITCH, p.act, INTER, kh * KH + kc, imin(CHK_E, KH - kc), p.rows);
          }
          cp_commit();
          cp_wait_all();
          csync();
          if (j0 == 0) stamp(p, layer, 13);
          for (int jj = 0; jj < jn; ++jj) {
            const int kc = (j0 + jj) * CHK_E;
            const u16* W = ring_wait(ring);
            mma_chunk<2>(acc, XS + jj * RP * EPITCH, EPITCH, 0, W, imin(CHK_E, KH - kc));
            ring_release(ring);
          }
        }
        red_store<2>(red, acc);
        csync();
        for (int i = threadIdx.x; i < p.rows * 16; i += NTHR) {
          const int r = i >> 4, c = i & 15;
          const float y = red_sum(red, r, c);
          asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p.hsum + (u64)r * HID + 16 * ct + c), "f"(y) : "memory");
        }
        csync();
      }
    }
    phase_end(p, layer, 4, epoch);
  }
  // exit: the last CTA out zeroes the barrier's counters
  if (threadIdx.x == 0) {
    u32 old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(p.bar + 1) : "memory");
    if (old == gridDim.x - 1) {
      p.bar[0] = 0u;
      p.bar[1] = 0u;
    }
  }
}
