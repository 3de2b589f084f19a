"""Expert parallelism from Python (moekit._moekit.ExpertParallel over caller_communicator): ranks
as Python threads, each bringing its own region and the collectives as Python callables — what a
torch.distributed program does with torch symmetric memory, here on the CPU. With identity
experts, combine(dispatch(x)) = k·x and dispatch_backward(combine_backward(dy)) = k·dy exactly
(f32, k = 2)."""
import threading

import numpy as np
import pytest

import moekit

W, L, H, K, T = 2, 2, 8, 2, 6


def routing(rank):
    rng = np.random.default_rng(10 + rank)
    idx = np.stack([rng.choice(W * L, size=K, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.uniform(0.1, 1.0, size=(T, K)).astype(np.float32)
    return idx, w


def run_group(world, region_bytes, body, connect=None):
    """body(rank, comm) on `world` Python threads, each rank a communicator over its own region
    (numpy u8; torch u8 when `connect` is moekit.torch.ep's) and collectives built on one
    threading.Barrier; the first rank's error re-raised (the barrier aborted so no rank hangs)."""
    barrier = threading.Barrier(world)
    slots = [None] * world
    if connect is None:
        regions = [np.zeros(region_bytes, dtype=np.uint8) for _ in range(world)]
        bases = [r.__array_interface__["data"][0] for r in regions]

        def connect(rank, region, bases, barrier_fn, gather):
            return moekit.caller_communicator(rank, world, moekit.Context.cpu(), region, bases,
                                              barrier_fn, gather)
    else:
        import torch
        regions = [torch.zeros(region_bytes, dtype=torch.uint8) for _ in range(world)]
        bases = [r.data_ptr() for r in regions]
    results, errors = [None] * world, []

    def all_gather_for(rank):
        def all_gather(b):
            barrier.wait()  # the previous gather's readers are done
            slots[rank] = bytes(b)
            barrier.wait()
            return list(slots)
        return all_gather

    def rank_main(rank):
        try:
            comm = connect(rank, regions[rank], bases, barrier.wait, all_gather_for(rank))
            results[rank] = body(rank, comm)
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def run_ranks(body, region_bytes):
    return run_group(W, region_bytes, body)


def run_processes(world, region_bytes, body, timeout=60):
    """body(rank, comm) on `world` forked processes: what a one-process-per-GPU program does. The
    ranks' regions are one memfd that each process maps itself, so a process's peer bases are its
    own addresses of the other ranks' blocks; barrier: a multiprocessing.Barrier; all_gather: a
    slot per rank in an inherited shared mapping between two barriers. Each body's result comes
    back pickled through a queue; a rank that fails, or does not finish in `timeout` s, fails."""
    import mmap
    import multiprocessing as mp
    import os
    import pickle
    import struct
    ctx = mp.get_context("fork")
    block = (region_bytes + 4095) // 4096 * 4096
    fd = os.memfd_create("moekit-ep-pytest")
    os.ftruncate(fd, block * world)
    slot = 4096
    slots = mmap.mmap(-1, world * (slot + 8))  # shared with the children (MAP_SHARED anonymous)
    barrier, results = ctx.Barrier(world), ctx.Queue()

    def rank_main(rank):
        try:
            mine = mmap.mmap(fd, block * world)  # this process's own mapping of every block
            arr = np.frombuffer(mine, dtype=np.uint8)
            base = arr.__array_interface__["data"][0]
            bases = [base + q * block for q in range(world)]

            def all_gather(b):
                barrier.wait()  # the previous gather's readers are done
                b = bytes(b)
                assert len(b) <= slot, "all_gather: more bytes than a slot holds"
                slots[rank * (slot + 8):rank * (slot + 8) + 8] = struct.pack("q", len(b))
                slots[rank * (slot + 8) + 8:rank * (slot + 8) + 8 + len(b)] = b
                barrier.wait()
                out = []
                for q in range(world):
                    n = struct.unpack("q", slots[q * (slot + 8):q * (slot + 8) + 8])[0]
                    out.append(slots[q * (slot + 8) + 8:q * (slot + 8) + 8 + n])
                return out
            comm = moekit.caller_communicator(rank, world, moekit.Context.cpu(),
                                              arr[rank * block:(rank + 1) * block], bases,
                                              barrier.wait, all_gather)
            results.put((rank, pickle.dumps(body(rank, comm)), None))
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            barrier.abort()
            results.put((rank, None, repr(e)))

    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            rank, res, err = results.get(timeout=timeout)
            assert err is None, f"rank {rank}: {err}"
            got[rank] = pickle.loads(res)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        os.close(fd)
    return [got[r] for r in range(world)]


def config():
    return dict(experts_per_rank=L, hidden=H, dtype="f32", topk=K, max_tokens=T,
                receive_capacity=W * T * K)


def identity_experts(rank, comm):
    """One rank's dispatch → identity experts (recv copied into the combine's input) → combine,
    and the backward likewise: (x, dy, out, d tokens, rows received, tokens per expert)."""
    assert (comm.rank, comm.world_size, comm.engine) == (rank, W, "caller-symmetric")
    ep = moekit.ExpertParallel(comm, **config())
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((T, H), dtype=np.float32)
    dy = rng.standard_normal((T, H), dtype=np.float32)
    idx, w = routing(rank)
    recv, splits, tokens_per_expert, weights, rows, handle = ep.dispatch(x, idx, w)
    y_exp = np.from_dlpack(ep.combine_input)
    y_exp[:rows] = np.from_dlpack(recv)[:rows]  # identity experts, into the combine's input
    out = np.from_dlpack(ep.combine(handle, ep.combine_input)).copy()
    grad_recv = np.from_dlpack(ep.combine_backward(handle, dy))
    dx_exp = np.from_dlpack(ep.dispatch_backward_input)
    dx_exp[:rows] = grad_recv[:rows]
    dtok, _ = ep.dispatch_backward(handle, ep.dispatch_backward_input)
    return x, dy, out, np.from_dlpack(dtok).copy(), rows, np.from_dlpack(tokens_per_expert).copy()


def test_identity_experts_give_k_times_the_tokens_forward_and_backward():
    need = moekit.ExpertParallel.symmetric_bytes(**config(), world_size=W)
    res = run_ranks(identity_experts, need)
    total_rows = 0
    for x, dy, out, dtok, rows, tpe in res:
        np.testing.assert_array_equal(out, K * x)
        np.testing.assert_array_equal(dtok, K * dy)
        total_rows += rows
        assert int(tpe.sum()) == rows
    assert total_rows == W * T * K  # every (token, expert) slot arrived once


def test_ranks_as_processes_give_k_times_the_tokens_as_threads_do():
    """The identity-experts check with each rank a process of its own (peer bases in each
    process's own address space): the same k·x and k·dy, and bit for bit the threads' results."""
    need = moekit.ExpertParallel.symmetric_bytes(**config(), world_size=W)
    procs = run_processes(W, need, identity_experts)
    threads = run_ranks(identity_experts, need)
    for (x, dy, out, dtok, rows, _), (_, _, out_t, dtok_t, rows_t, _) in zip(procs, threads):
        np.testing.assert_array_equal(out, K * x)
        np.testing.assert_array_equal(dtok, K * dy)
        np.testing.assert_array_equal(out, out_t)
        np.testing.assert_array_equal(dtok, dtok_t)
        assert rows == rows_t


def test_a_region_too_small_is_refused_on_every_rank_naming_bytes():
    need = moekit.ExpertParallel.symmetric_bytes(**config(), world_size=W)
    with pytest.raises(ValueError, match="'bytes'.*left of the caller's"):
        run_ranks(lambda rank, comm: moekit.ExpertParallel(comm, **config()), need - 256)


def test_a_bad_group_names_the_field():
    region = np.zeros(4096, dtype=np.uint8)
    base = region.__array_interface__["data"][0]
    with pytest.raises(ValueError, match="'rank'"):
        moekit.caller_communicator(2, 2, moekit.Context.cpu(), region, [base, base],
                                   lambda: None, lambda b: [b, b])
    with pytest.raises(ValueError, match="'peer_bases'"):
        moekit.caller_communicator(0, 2, moekit.Context.cpu(), region, [base + 64, base],
                                   lambda: None, lambda b: [b, b])


# ---- moekit.torch.ep: the expert MLP between dispatch and combine, autograd end to end
def torch_step(world, rank, comm, data):
    import torch
    from moekit.torch import ops
    from moekit.torch.ep import ExpertParallel
    E, Hd, F, Tr = data["E"], data["H"], data["F"], data["T"] // world
    Lr = E // world
    ep = ExpertParallel(comm, Lr, Hd, K, Tr, world * Tr * K, dtype=torch.float32)
    fc1 = ops.GroupedLinear(Lr, Hd, 2 * F, bias=False, device="cpu", dtype=torch.float32)
    act = ops.ScaledSwiGLU()
    fc2 = ops.GroupedLinear(Lr, F, Hd, bias=False, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        fc1.weight.copy_(data["w1"][rank * Lr:(rank + 1) * Lr])
        fc2.weight.copy_(data["w2"][rank * Lr:(rank + 1) * Lr])
    mlp = ops.Sequential(fc1, act, fc2)
    rows = slice(rank * Tr, (rank + 1) * Tr)
    x = data["x"][rows].clone().requires_grad_()
    w = data["w"][rows].clone().requires_grad_()
    recv, splits, probs, handle = ep.dispatch(x, data["idx"][rows], w)
    y_exp = mlp(recv, splits, probs, splits,
                op_kwargs={fc2: {"output": ep.combine_input},
                           fc1: {"grad_input": ep.dispatch_backward_input}})
    assert y_exp.data_ptr() == ep.combine_input.data_ptr()  # zero copy
    y = ep.combine(handle, y_exp)
    (y * data["dy"][rows]).sum().backward()
    return y.detach(), x.grad, w.grad, fc1.weight.grad, fc2.weight.grad


def run_torch_ranks(world, data):
    from moekit.torch.ep import ExpertParallel, caller_communicator
    Tr = data["T"] // world
    need = ExpertParallel.symmetric_bytes(data["E"] // world, data["H"], K, Tr, world * Tr * K,
                                          world, dtype=data["x"].dtype)

    def connect(rank, region, bases, barrier_fn, gather):
        return caller_communicator(rank, world, region, bases, barrier_fn, gather)
    return run_group(world, need, lambda rank, comm: torch_step(world, rank, comm, data), connect)


def test_torch_ep_layer_on_two_ranks_equals_one_rank_bit_for_bit():
    """dispatch → moekit.torch grouped MLP writing the combine's buffer → combine, loss.backward():
    y, dx, d topk_weights and each expert's dW1 / dW2 on 2 ranks bit-identical to 1 rank holding
    every expert (experts per rank powers of two: the combine's tree is the same)."""
    import torch
    E, Hd, F, Tt = 4, 16, 16, 12
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(Tt)])
    data = dict(E=E, H=Hd, F=F, T=Tt, idx=idx,
                x=torch.randn(Tt, Hd, generator=g), dy=torch.randn(Tt, Hd, generator=g),
                w=torch.rand(Tt, K, generator=g) + 0.1,
                w1=torch.randn(E, 2 * F, Hd, generator=g) / 4,
                w2=torch.randn(E, Hd, F, generator=g) / 4)
    one = run_torch_ranks(1, data)[0]
    # The one-rank layer itself against plain torch in fp64: y_t = sum_j MLP_e(x_t) with p = w_tj.
    x64, ref = data["x"].double(), torch.zeros(Tt, Hd, dtype=torch.float64)
    for t in range(Tt):
        for j in range(K):
            e = int(idx[t, j])
            h = data["w1"][e].double() @ x64[t]
            z = data["w"][t, j].double() * torch.nn.functional.silu(h[:F]) * h[F:]
            ref[t] += data["w2"][e].double() @ z
    torch.testing.assert_close(one[0].double(), ref, rtol=1e-4, atol=1e-5)
    two = run_torch_ranks(2, data)
    for r, (y, dx, dw, dw1, dw2) in enumerate(two):
        rows, ex = slice(r * Tt // 2, (r + 1) * Tt // 2), slice(r * E // 2, (r + 1) * E // 2)
        assert torch.equal(y, one[0][rows]), f"y, rank {r}"
        assert torch.equal(dx, one[1][rows]), f"dx, rank {r}"
        assert torch.equal(dw, one[2][rows]), f"d topk_weights, rank {r}"
        assert torch.equal(dw1, one[3][ex]), f"dW1, rank {r}"
        assert torch.equal(dw2, one[4][ex]), f"dW2, rank {r}"
    assert one[1].abs().sum() > 0 and one[2].abs().sum() > 0  # gradients really flowed
