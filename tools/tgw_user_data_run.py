"""One harness run with the extension installed where today's text-generation-webui users put it.

    python tools/tgw_user_data_run.py HARNESS_DIR [run_in_tgw.py arguments...]

Runs the text-generation-webui harness (`HARNESS_DIR/run_in_tgw.py`, from ../shared/tgw) unchanged,
except that after it builds its overlay the extension's copy moves from `extensions/multimodal/` to
`user_data/extensions/multimodal/`: current text-generation-webui then loads `script.py` by its file
path (as module `user_ext_multimodal`), not as the package `extensions.multimodal`.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main() -> None:
    harness = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(harness))
    import run_in_tgw

    build_overlay = run_in_tgw.build_overlay

    def overlay_with_user_data_install(tgw, ext_dir, run_dir, shims):
        root = build_overlay(tgw, ext_dir, run_dir, shims)
        user_extensions = root / "user_data" / "extensions"
        if not user_extensions.parent.is_dir():
            raise SystemExit(f"{tgw} has no user_data/ folder: this text-generation-webui loads extensions "
                             f"from extensions/ only")
        user_extensions.mkdir(exist_ok=True)
        shutil.move(str(root / "extensions" / "multimodal"), str(user_extensions / "multimodal"))
        shims.append("extension moved to user_data/extensions/multimodal (loaded by file path)")
        return root

    run_in_tgw.build_overlay = overlay_with_user_data_install
    sys.argv = [str(harness / "run_in_tgw.py")] + sys.argv[2:]
    run_in_tgw.main()


if __name__ == "__main__":
    main()
