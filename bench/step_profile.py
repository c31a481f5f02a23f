"""Where one decode step's time goes, under torch's profiler (bench/decode.py `--profile`).

`StepWindow` is ticked once per decoding step from inside the loop (a logits processor calls `tick`),
starts torch's profiler after `skip` steps and stops it `steps` steps later: the profile holds whole
decode steps, never the prefill or what a turn does once. Per step:
  wall_us:    the step's wall time;
  device_us:  the time the device spent working: on a GPU its kernels (every thread's: CUPTI sees
              them all), on a CPU torch's operators in every thread;
  busy:       device_us / wall_us. On a GPU 1 - busy is the share of the step it waited for the host
              (Python, launches, syncs): what a faster loop on the host can win back. On a CPU it is the
              share spent in operators rather than around them;
  kernels:    (on a CPU, operators) how many ran;
  top:        the kernels (operators) that took most of the step, microseconds each;
  host_calls: on a GPU, the CUDA runtime's calls per step: launches (cudaLaunchKernel, cudaGraphLaunch)
              and those that wait for the device (cudaStreamSynchronize, a cudaMemcpyAsync to the
              host): each wait stops the host from queueing the next kernels ahead;
  host_top:   on a GPU, the host's operators and runtime calls that took most of its time (a sync's
              time is its wait).
A window of one "step" from a turn's start to its first token (skip 0) shows where a TTFT goes
(bench/multiturn.py `--profile`).
The profiler slows every launch: compare columns with one another, not with the unprofiled rates.
"""
from __future__ import annotations

import time

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

TOP = 8
_kineto_ready = False


def profiler(device: str) -> profile:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    try:
        from torch._C._profiler import _ExperimentalConfig

        # The host generates in its own thread, and the window starts there: every thread's operators count.
        config = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # an older torch: the starting thread's operators only
        config = None
    return profile(activities=activities, experimental_config=config)


class StepWindow:
    """Profiles `steps` decoding steps after the first `skip` (see the module's docstring)."""

    def __init__(self, device: str, skip: int, steps: int) -> None:
        self.device, self.skip, self.steps = device, skip, steps
        self.ticks = 0
        global _kineto_ready
        if not _kineto_ready:  # kineto sets itself up on the first profiler's thread, and the window
            with profiler(device):  # starts in the generating one ("External init callback must run
                pass  # in same thread as registerClient"): set it up here, on the caller's
            _kineto_ready = True
        self.prof = profiler(device)
        self.started = self.wall = None

    def tick(self) -> None:
        """Once per decoding step, from the loop."""
        self.ticks += 1
        if self.ticks == self.skip + 1:
            self.prof.start()
            self.started = time.perf_counter()
        elif self.ticks == self.skip + 1 + self.steps:
            self.wall = time.perf_counter() - self.started
            self.prof.stop()

    def result(self) -> dict:
        if self.wall is None:
            raise RuntimeError(f"the reply ended after {self.ticks} steps, before the window's "
                               f"{self.skip + 1 + self.steps}")
        work: dict[str, float] = {}
        host: dict[str, float] = {}  # on a GPU: the host's side, operators' dispatch and the runtime's calls
        calls: dict[str, int] = {}
        kernels = 0
        for event in self.prof.key_averages():
            if self.device == "cuda" and event.device_type == DeviceType.CUDA:
                work[event.key] = work.get(event.key, 0.0) + event.self_device_time_total
                kernels += event.count
                continue
            if event.device_type != DeviceType.CPU:
                continue
            if self.device != "cuda":
                work[event.key] = work.get(event.key, 0.0) + event.self_cpu_time_total
                kernels += event.count
                continue
            host[event.key] = host.get(event.key, 0.0) + event.self_cpu_time_total
            if event.key.startswith("cuda"):  # the runtime: launches, copies, syncs
                calls[event.key] = calls.get(event.key, 0) + event.count
        wall_us = self.wall / self.steps * 1e6
        device_us = sum(work.values()) / self.steps
        top = sorted(work.items(), key=lambda item: -item[1])[:TOP]
        result = {"steps": self.steps, "wall_us": round(wall_us, 1), "device_us": round(device_us, 1),
                  "busy": round(device_us / wall_us, 3),
                  "kernels" if self.device == "cuda" else "operators": round(kernels / self.steps, 1),
                  "top": [[name[:100], round(us / self.steps, 1)] for name, us in top]}
        if self.device == "cuda":
            result["host_calls"] = {name: round(count / self.steps, 2) for name, count in sorted(calls.items())}
            result["host_top"] = [[name[:100], round(us / self.steps, 1)]
                                  for name, us in sorted(host.items(), key=lambda item: -item[1])[:TOP]]
        return result
