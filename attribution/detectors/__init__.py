"""The detectors: telemetry -> incidents, one package or module per incident class (crash/, hang/
and progress/, straggler/, loss, health, desync). The one extension point is the Detector protocol
and its registry (base.py); builtin.py registers the built-in detectors in the order the engine runs
them."""
