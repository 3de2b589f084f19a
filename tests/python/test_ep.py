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


def run_ranks(body, region_bytes):
    barrier = threading.Barrier(W)
    slots = [None] * W
    regions = [np.zeros(region_bytes, dtype=np.uint8) for _ in range(W)]
    bases = [r.__array_interface__["data"][0] for r in regions]
    results, errors = [None] * W, []

    def all_gather_for(rank):
        def all_gather(b):
            barrier.wait()  # the previous gather's readers are done
            slots[rank] = bytes(b)
            barrier.wait()
            return list(slots)
        return all_gather

    def rank_main(rank):
        try:
            comm = moekit.caller_communicator(rank, W, moekit.Context.cpu(), regions[rank], bases,
                                              barrier.wait, all_gather_for(rank))
            results[rank] = body(rank, comm)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def config():
    return dict(experts_per_rank=L, hidden=H, dtype="f32", topk=K, max_tokens=T,
                receive_capacity=W * T * K)


def test_identity_experts_give_k_times_the_tokens_forward_and_backward():
    need = moekit.ExpertParallel.symmetric_bytes(**config(), world_size=W)

    def body(rank, comm):
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
        return x, dy, out, np.from_dlpack(dtok).copy(), rows, np.from_dlpack(tokens_per_expert)

    res = run_ranks(body, need)
    total_rows = 0
    for x, dy, out, dtok, rows, tpe in res:
        np.testing.assert_array_equal(out, K * x)
        np.testing.assert_array_equal(dtok, K * dy)
        total_rows += rows
        assert int(tpe.sum()) == rows
    assert total_rows == W * T * K  # every (token, expert) slot arrived once


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
