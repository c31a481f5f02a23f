"""tools/gpu_check_report.py on a decode section stopped by its time limit: the figures of the runs it logged.

On a lent GPU the decode section can run out of its budget while transformers compiles (an H100 run left
no rates at all). bench/decode.py logs every measured run as it ends; the report reads them back when the
bench's JSON never came. Here the bench runs for real (tiny, on the CPU) and its JSON is left out of the log.
With `--profile` it also logs where each column's decoding step goes (bench/step_profile.py), and with
`--attention-backends` the history's rates with and without cuDNN's attention.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gpu_check_report

ROOT = Path(__file__).resolve().parent.parent


def test_a_decode_log_without_its_json_still_gives_the_rates(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "decode.py"), "--device", "cpu", "--size", "small",
                          "--text-layers", "1", "--runs", "2", "--new-tokens", "8", "--profile", "--attention-backends",
                          "--json"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    bench = json.loads(run.stdout.strip().splitlines()[-1])
    (tmp_path / "decode.log").write_text(run.stderr)  # the progress alone, as a stopped run leaves it

    figures = gpu_check_report.decode_figures(tmp_path)

    assert figures["bench"] is None
    logged = figures["runs_logged"]
    for column in ("ours", "hf"):
        assert len(logged[column]["tokens_per_s"]) == 2
        assert logged[column]["tokens_per_s"] == bench[column]["tokens_per_s"]
        assert logged[column]["ttft_ms"] == bench[column]["ttft_ms"]
    # The log's figures are rounded before their median is taken, the JSON's after.
    assert logged["ratio_ours_vs_hf"] == pytest.approx(bench["ratio_ours_vs_hf"], abs=0.002)
    assert set(figures["warm_up_s"]) == {"ours", "hf"}
    # --profile: each column's steps under torch's profiler, logged as the JSON has them. A window that
    # missed the decoding steps (or the generating thread's operators) would hold next to nothing: a step
    # of this one-layer Llama with its logits processors runs a few hundred operators.
    for column in ("ours", "hf"):
        profile = bench[column]["step_profile"]
        assert figures["profiles_logged"][column] == profile
        assert profile["steps"] == 6 and profile["operators"] > 100 and 0 < profile["busy"], profile
        assert any(name == "aten::mm" for name, _ in profile["top"]), profile["top"]
    # --attention-backends: the three writings of the history, each turn's rate logged as the JSON has it; the
    # second writing is the first one's chat again (its lengths are what cuDNN's kept plans are for).
    backends = bench["attention_backends"]
    assert figures["attention_backends_logged"] == backends
    assert set(backends) == {"cudnn_new_lengths", "cudnn_seen_lengths", "without_cudnn"}
    assert all(len(writing["tokens_per_s"]) == 4 for writing in backends.values()), backends
    assert backends["cudnn_seen_lengths"]["same_replies"] is True
