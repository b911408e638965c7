"""Put on PYTHONPATH by `faultlens campaign` only: installs the fault injector in the processes of a campaign
scenario (controller/lab/inject.py). Outside a campaign (no FAULTLENS_LAB_DIR) it does nothing."""

import os

if os.environ.get("FAULTLENS_LAB_DIR"):
    try:
        from faultlens.controller.lab.inject import install_from_env

        install_from_env()
    except Exception as exc:  # never break a process over the campaign's instrument
        import sys

        print(f"faultlens lab: sitecustomize: {type(exc).__name__}: {exc}", file=sys.stderr)
