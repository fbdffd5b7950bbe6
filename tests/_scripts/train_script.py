"""A user's training script, written for the tests (not perfkit code): its own flags, its own
loop, its own torchrun call for several ranks, and it prints its numbers the ways real scripts do
(ROCm/MAD's `performance:` line, JSON lines with a prefix)."""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep (a hung script)")
parser.add_argument("--oom", action="store_true", help="fail as an allocator would")
parser.add_argument("--fail", action="store_true")
parser.add_argument("--silent", action="store_true", help="exit 0 without printing any metric")
parser.add_argument("--spawn", action="store_true", help="leave a child process running (the teardown test)")
args = parser.parse_args()

if args.spawn:
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"child pid {child.pid}", flush=True)
if args.sleep:
    time.sleep(args.sleep)
if args.fail:
    print("Traceback (most recent call last):\nValueError: the data path does not exist", file=sys.stderr)
    sys.exit(3)
if args.silent:
    sys.exit(0)  # ran, said nothing a reader can use
if args.oom:
    print("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes.",
          file=sys.stderr)
    sys.exit(1)

import torch  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dtype = torch.bfloat16 if args.bf16 else None
rank = int(os.environ.get("RANK", "0"))
# A setting read from the environment, as real scripts read theirs (NCCL_*, TORCH_*): a delay in
# every step, the known effect of the A/B test's "change" variant.
step_delay_s = float(os.environ.get("TRAIN_SCRIPT_STEP_DELAY_S", "0"))
times = []
for step in range(args.steps):
    x, y = torch.randn(args.batch_size, 32), torch.randint(0, 4, (args.batch_size,))
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(step_delay_s)
    times.append(time.perf_counter() - t0)
    if rank == 0:
        print("PERFKIT_METRIC " + json.dumps({"step_time_ms": times[-1] * 1e3, "loss": loss.item()}), flush=True)
if rank == 0:
    print(f"performance: {args.batch_size / (sum(times[1:]) / max(1, len(times) - 1)):.3f} samples_per_second")
