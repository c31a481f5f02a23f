"""The one JSON object `tools/gpu_check.sh` prints at its end: each section's verdict and figures.

    python tools/gpu_check_report.py WORK_DIR DEVICE      # DEVICE: cuda or cpu

Reads what the sections left in WORK_DIR: `verdicts` (one line per section: name, exit status, seconds,
budget), `families.json` and `vision-*.json` (tools/families_on_device.py), `tgw-verdicts` and the harness's
reports, the last JSON line of `multiturn.log` (bench/multiturn.py's summary) and of `decode.log`
(bench/decode.py --json, with torch.compile's notes on CUDA graphs it skipped and recompiles). A section passes when it exited 0; the multiturn bench also needs identical
tokens, or every difference starting where Hugging Face's top two scores tie exactly. Exit 1 when any
section failed. Standard library and torch only (torch for the GPU's name).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def last_json(path: Path):
    """The last line of `path` that is a JSON object, or None."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def family_verdicts(path: Path) -> dict | None:
    """Per family, one short verdict of tools/families_on_device.py's JSON."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    verdicts = {}
    for name, result in data["families"].items():
        if not result["ok"] and "hf_top2_margin" in result:
            verdicts[name] = (f"FAIL: ours {result['ours']!r}, Hugging Face {result['hf']!r}: from step "
                              f"{result['first_differing_step']}, where its top-two margin is {result['hf_top2_margin']}")
        elif not result["ok"]:
            verdicts[name] = f"FAIL: {result.get('error') or result.get('refused') or result}"
        elif "refused" in result:
            verdicts[name] = "refused, as it must be: " + result["refused"].split("Cause: ")[-1][:160]
        elif "reference_unavailable" in result:
            verdicts[name] = f"ours ran; Hugging Face cannot: {result['reference_unavailable'][:120]}"
        elif "hf_top2_margin" in result:
            verdicts[name] = f"an exact tie of Hugging Face's top two at step {result['first_differing_step']}, broken the other way"
        elif "static_slots" in result:
            verdicts[name] = (f"static cache ({result['static_slots']} slots): every reply the dynamic path's; "
                              f"{result['seconds_static_with_compile']} s (its first turn compiles, on CUDA), "
                              f"{result['seconds_dynamic']} s dynamic")
        elif "relative_row_error" in result:
            verdicts[name] = f"rows within {result['relative_row_error']} of the unmoved tower's; tower {result['tower']}"
        else:
            verdicts[name] = f"identical to Hugging Face; tower {result['tower']}"
    return {"lm": data["lm"], "vision": data["vision"], "ok": data["ok"], "families": verdicts}


def tgw_figures(work: Path) -> dict:
    runs = {}
    verdicts = work / "tgw-verdicts"
    for line in (verdicts.read_text().splitlines() if verdicts.is_file() else []):
        name, rc = line.split()
        log = work / f"tgw-{name}.log"
        result = next((l for l in reversed(log.read_text(errors="replace").splitlines()) if "RESULT" in l), "")
        runs[name] = "PASS" if rc == "0" else f"FAIL (exit {rc}): {result[-200:] or 'see ' + log.name}"
    return {"runs": runs}


def multiturn_figures(work: Path) -> tuple[dict | None, bool]:
    summary = last_json(work / "multiturn.log")
    if summary is None:
        return None, False
    table = work / "multiturn-table.json"
    figures = {"summary": summary}
    if table.is_file():
        data = json.loads(table.read_text())
        figures.update(device=data.get("device"), turns=data.get("turns"))
    return figures, bool(summary.get("tokens_identical") or summary.get("differences_are_exact_ties"))


def decode_figures(work: Path) -> dict:
    """bench/decode.py's JSON, and what torch.compile logged meanwhile (TORCH_LOGS=cudagraphs,perf_hints,recompiles):
    the distinct reasons it gave for skipping CUDA graphs, and how many recompiles."""
    log = work / "decode.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    skipped = sorted({l.split("skipping cudagraphs", 1)[1].strip()[:200] for l in lines if "skipping cudagraphs" in l})
    figures = {"bench": last_json(log), "cudagraphs_skipped": skipped,
               "recompiles": sum("Recompiling function" in l for l in lines)}
    if figures["bench"] is None:  # stopped before its JSON: the runs it logged
        figures["runs_logged"] = logged_runs(lines)
        figures["warm_up_s"] = {m[1]: float(m[2]) for m in map(WARM_UP.match, lines) if m}
        figures["profiles_logged"] = {m[1]: json.loads(m[2]) for m in map(PROFILE_LINE.match, lines) if m}
        figures["attention_backends_logged"] = {m[1]: json.loads(m[2]) for m in map(ATTENTION_LINE.match, lines) if m}
    return figures


# bench/decode.py's progress lines: "run 1        ours: ttft    63.1 ms (whole ...), 24.1 tokens/s"
RUN_LINE = re.compile(r"run \d+ +(\w+): ttft +([\d.]+) ms.*?([\d.]+) tokens/s$")
WARM_UP = re.compile(r"warm-up (\w+): ([\d.]+) s$")
PROFILE_LINE = re.compile(r"profile +(\w+): (\{.*\})$")  # --profile: "profile        ours: {...}"
ATTENTION_LINE = re.compile(r"attention (\w+): (\{.*\})$")  # --attention-backends: "attention without_cudnn: {...}"


def logged_runs(lines: list[str]) -> dict:
    runs: dict = {}
    for match in filter(None, map(RUN_LINE.match, lines)):
        runs.setdefault(match[1], {"tokens_per_s": [], "ttft_ms": []})
        runs[match[1]]["tokens_per_s"].append(float(match[3]))
        runs[match[1]]["ttft_ms"].append(float(match[2]))
    for column in runs.values():
        column["median_tokens_per_s"] = statistics.median(column["tokens_per_s"])
    if "ours" in runs and "hf" in runs:
        runs["ratio_ours_vs_hf"] = round(runs["ours"]["median_tokens_per_s"] / runs["hf"]["median_tokens_per_s"], 3)
    return runs


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    return next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), "CPU")


def main() -> int:
    work, device = Path(sys.argv[1]), sys.argv[2]
    sections = {}
    for line in (work / "verdicts").read_text().splitlines():
        name, rc, seconds, budget = line.split()
        log = work / f"{name}.log"
        tail = log.read_text(errors="replace").splitlines()[-3:] if log.is_file() else []
        sections[name] = {"ok": rc == "0", "exit": int(rc), "seconds": int(seconds), "budget_s": int(budget),
                          "timed_out": rc in ("124", "137"), "log_tail": [l[-300:] for l in tail]}
    figures = {
        "setup": lambda: {"log": (work / "setup.log").read_text(errors="replace").splitlines()[-4:]},
        "families": lambda: family_verdicts(work / "families.json"),
        "static": lambda: family_verdicts(work / "static.json"),
        "vision": lambda: [family_verdicts(p) for p in sorted(work.glob("vision-*.json"))],
        "tgw": lambda: tgw_figures(work),
        "decode": lambda: decode_figures(work),
    }
    for name, section in sections.items():
        if name == "multiturn":
            section["figures"], identical = multiturn_figures(work)
            section["ok"] = section["ok"] and identical
        elif name in figures:
            section["figures"] = figures[name]()
    name = device_name(device)
    report = {"device": device, "gpu": name if device == "cuda" else None, "machine": name,
              "ok": all(s["ok"] for s in sections.values()),
              "sections": sections}
    print(json.dumps(report, indent=1, ensure_ascii=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
