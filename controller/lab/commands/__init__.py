"""The lab's own CLI commands (`faultlens campaign`, `faultlens simulate`, `faultlens eval`): listed
by name in the CLI's COMMAND_MODULES, so nothing outside the lab imports it."""
