"""Views of the store for people: jobs, one incident, and the per-job HTML report."""
