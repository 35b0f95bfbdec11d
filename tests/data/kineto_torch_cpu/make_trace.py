"""Write a real torch.profiler trace of a tiny CPU training loop whose DataLoader
sleeps 5 ms per sample (4 per batch): ``python make_trace.py OUT.pt.trace.json``.

This is how ``vm_468.pt.trace.json.gz`` was made (torch 2.13.0+cpu, then gzip -9).
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """64 random samples, each taking 5 ms to load."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.005)
        return torch.randn(32), torch.randn(1)


def main(out: str) -> None:
    """Profile steps 2-5 (wait 1, warm-up 1, active 4) of the loop into ``out``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=4)
    sched = torch.profiler.schedule(wait=1, warmup=1, active=4, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for step, (x, y) in enumerate(loader):
            with torch.profiler.record_function("## forward ##"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if step >= 7:
                break


if __name__ == "__main__":
    main(sys.argv[1])
