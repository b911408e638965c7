"""Put on PYTHONPATH by `faultlens campaign` only: installs the fault injector in the processes of a
campaign scenario (controller/lab/inject.py). Outside a campaign (no FAULTLENS_LAB_DIR) it does
nothing."""

try:
    from faultlens.environment import LAB_DIR

    _IN_CAMPAIGN = bool(LAB_DIR.get())
except ImportError:  # not a campaign's process: faultlens is not importable here
    _IN_CAMPAIGN = False

if _IN_CAMPAIGN:
    try:
        from faultlens.controller.lab.inject import install_from_env

        install_from_env()
    except Exception as exc:  # never break a process over the campaign's instrument
        import sys

        print(f"faultlens lab: sitecustomize: {type(exc).__name__}: {exc}", file=sys.stderr)
