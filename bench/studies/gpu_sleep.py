"""bench/studies/gpu_sleep.py — what the studies that queue a torch.cuda._sleep before timed work
share (python_gap.py, python_host_wait.py): the sleep's cycles per millisecond on this GPU now."""
import torch


def sleep_cycles_per_ms():
    """torch.cuda._sleep(cycles) spins the SM clock; cycles per ms at the clock this GPU runs now
    (measured over a 10M-cycle sleep between two events)."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return 10_000_000 / a.elapsed_time(b)
