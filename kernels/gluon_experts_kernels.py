"""The Gluon kernels of kernels.gluon_experts (sm90), in a module of their own: importing Gluon takes time that only
the processes running them should pay (kernels.gluon_experts imports this module at its first call)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["TensorDescriptor", "experts_gemm", "gl"]


@gluon.jit
def _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, w_row2, kb, num_k, STAGES: gl.constexpr,
            BLOCK_K: gl.constexpr, GATED: gl.constexpr):
    """TMA loads of K block `kb` (when there is one) into its stage: A's rows and W's (both halves if GATED)."""
    if kb < num_k:
        t = kb % STAGES
        W_PER: gl.constexpr = 2 if GATED else 1
        nbytes: gl.constexpr = a_desc.block_type.nbytes + w_desc.block_type.nbytes * W_PER
        mbarrier.expect(bars.index(t), nbytes)
        tma.async_copy_global_to_shared(a_desc, [m0, kb * BLOCK_K], bars.index(t), a_bufs.index(t))
        tma.async_copy_global_to_shared(w_desc, [w_row, kb * BLOCK_K], bars.index(t), w_bufs.index(W_PER * t))
        if GATED:
            tma.async_copy_global_to_shared(w_desc, [w_row2, kb * BLOCK_K], bars.index(t),
                                            w_bufs.index(W_PER * t + 1))

@gluon.jit
def _block_promoted(acc, a_s, w_s, zero, sa, sw):
    """acc + the K block's product: its MMAs summed by the tensor core, waited for, then scaled in fp32 (the
    other CTAs' MMAs run on the tensor cores meanwhile)."""
    part = warpgroup_mma(a_s, w_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
    return acc + part * (sa[:, None] * sw[None, :])

@gluon.jit
def experts_gemm(a_desc, w_desc, c_ptr, as_ptr, ws_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, rw_ptr,
                  numel, N, K, W_ROWS, stride_cm, stride_asm, stride_wse, stride_wsn,
                  GATED: gl.constexpr, SCATTER: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  BLOCK_K: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One output tile of a grouped GEMM over expert-ordered rows of A (fp8, 1x128 scales as_) and W (fp8,
    128x128 scales ws_; W_ROWS rows an expert). GATED (GEMM1): columns n of silu(A.Wg) * A.Wu, Wg the rows n
    and Wu the rows N + n of the expert, stored at the same row of C. SCATTER (GEMM2): the product times the
    router weight of the row's slot, stored at that slot's row of C (padding rows dropped)."""
    num_post = gl.load(num_post_ptr)
    BN: gl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N
    tiles_n = gl.cdiv(N, BN)
    pid = gl.program_id(0)
    pid_m = pid // tiles_n
    m0 = pid_m * BLOCK_M
    n0 = (pid % tiles_n) * BN
    if m0 < num_post:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 32])
        e = gl.load(expert_ids_ptr + pid_m)
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        sa_ptrs = as_ptr + rows * stride_asm
        # unmasked: past N these read other rows' scales of the same tensor, for columns never stored
        sw_ptrs = ws_ptr + e * stride_wse + (cols // 128) * stride_wsn
        sw2_ptrs = ws_ptr + e * stride_wse + ((N + cols) // 128) * stride_wsn
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        W_PER: gl.constexpr = 2 if GATED else 1  # W tiles a stage holds: gate and up, or one
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [W_PER * STAGES, BN, BLOCK_K], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        num_k = gl.cdiv(K, BLOCK_K)
        w_row = e * W_ROWS + n0
        w_row2 = w_row + N
        for i in gl.static_range(STAGES - 1):
            _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, w_row2, i, num_k, STAGES, BLOCK_K, GATED)
        zero = gl.zeros([BLOCK_M, BN], gl.float32, layout=mma)
        acc = gl.zeros([BLOCK_M, BN], gl.float32, layout=mma)
        acc2 = gl.zeros([BLOCK_M, BN], gl.float32, layout=mma)
        for kb in range(num_k):
            # every warp is done with the previous block's stage: TMA may refill it
            gl.thread_barrier()
            _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, w_row2, kb + STAGES - 1, num_k, STAGES,
                    BLOCK_K, GATED)
            s = kb % STAGES
            mbarrier.wait(bars.index(s), (kb // STAGES) & 1)
            sa = gl.load(sa_ptrs + kb)
            sw = gl.load(sw_ptrs + kb)
            acc = _block_promoted(acc, a_bufs.index(s), w_bufs.index(W_PER * s), zero, sa, sw)
            if GATED:
                sw2 = gl.load(sw2_ptrs + kb)
                acc2 = _block_promoted(acc2, a_bufs.index(s), w_bufs.index(W_PER * s + 1), zero, sa, sw2)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        if GATED:  # silu(gate) * up in fp32, rounded once
            acc = acc / (1.0 + gl.exp(-acc)) * acc2
        if SCATTER:
            slot = gl.load(sorted_ids_ptr + rows)
            row_ok = slot < numel
            rw = gl.load(rw_ptr + slot, mask=row_ok, other=0.0).to(gl.float32)
            acc = acc * rw[:, None]
            out_rows = slot
        else:
            row_ok = rows < num_post
            out_rows = rows
        store: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        val = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), store)
        srows = gl.convert_layout(out_rows, gl.SliceLayout(1, store))
        sok = gl.convert_layout(row_ok, gl.SliceLayout(1, store))
        scols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, store))
        gl.store(c_ptr + srows[:, None].to(gl.int64) * stride_cm + scols[None, :], val,
                 mask=sok[:, None] & (scols < N)[None, :])
