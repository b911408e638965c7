"""faultlens job-controller side: decision delivery, checkpoint restore, the supervisor and the CLI.
"""
