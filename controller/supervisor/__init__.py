"""The reference supervisor for torchrun jobs (faultlens run)."""
