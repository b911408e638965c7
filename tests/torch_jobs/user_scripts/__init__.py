"""Training scripts written the way users write them (tests/torch_jobs/user_jobs.py runs them)."""
