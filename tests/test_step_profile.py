"""bench/step_profile.py's windows hold what they say: a TTFT's span holds that turn's work.

bench/multiturn.py `--profile` profiles each turn of a picture chat from its start to its first token
(tools/gpu_check.sh runs it on a lent GPU, where a turn's TTFT once took ten times its neighbours'). Run
for real here, tiny, on the CPU: the turns with a new picture, and only those, run the vision tower's
patch convolution inside their window; a window that started late, stopped early or missed the
generating thread would not see it (bench/decode.py's decode windows: tests/test_gpu_check_report.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_each_turns_ttft_window_holds_its_pictures_tower(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "multiturn.py"), "--size", "micro", "--repeats", "1",
                          "--max-new-tokens", "4", "--profile", "--json-out", str(tmp_path / "table.json")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    profiles = json.loads(run.stdout.strip().splitlines()[-1])["ttft_profiles"]
    assert [p["turn"] for p in profiles] == [1, 2, 3, 4, 5] and not any("error" in p for p in profiles), profiles
    convolving = [p["turn"] for p in profiles if any(name == "aten::mkldnn_convolution" for name, _ in p["top"])]
    assert convolving == [1, 3], profiles
    assert all(0 < p["device_us"] <= p["wall_us"] * 2 and p["operators"] > 50 for p in profiles), profiles
