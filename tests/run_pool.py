"""The real jobs of one test module started together, a few at a time, each test waiting for its
own.

A `faultlens run` of a 2 x 2 job spends much of its wall time waiting (torchrun's rendezvous, a
hang floor, a slow save, a teardown, the supervisor's grace periods), so two of them overlap on
two cores where one after the other each wait is paid in full. Only the jobs of the tests pytest
selected are started (a `-k` run starts one); each job gets its own directory under the module's
temporary root, and a test reads the result of the job registered under its own name.

    JOBS = ModuleJobs({"test_name[param]": lambda directory: run(directory, ...)})

    @pytest.fixture(scope="module")
    def jobs(request, tmp_path_factory):
        with JOBS.started(request, tmp_path_factory.mktemp("jobs")) as started:
            yield started

    def test_name(jobs, request, param):
        result, directory = jobs.result(request)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")

#: jobs run at once: two 2 x 2 jobs (12 processes) overlap their waits on 2 cores
CONCURRENT = 2


class ModuleJobs(Generic[T]):
    """Jobs by test name (pytest's item name, parameters included), in the order they start."""

    def __init__(self, jobs: dict[str, Callable[[Path], T]], concurrent: int = CONCURRENT) -> None:
        self.jobs = jobs
        self.concurrent = concurrent
        self._futures: dict[str, Future] = {}
        self._root: Path | None = None

    @contextlib.contextmanager
    def started(self, request: pytest.FixtureRequest, root: Path) -> Iterator[ModuleJobs[T]]:
        """Start the jobs of this module's selected tests; at the end wait for every job (a job
        never outlives its module)."""
        selected = {item.name for item in request.session.items if item.module is request.module}
        self._root = root
        pool = ThreadPoolExecutor(max_workers=self.concurrent, thread_name_prefix="module-job")
        try:
            for name, job in self.jobs.items():
                if name in selected:
                    directory = root / _safe(name)
                    directory.mkdir(parents=True)
                    self._futures[name] = pool.submit(job, directory)
            yield self  # a selected test without a job of its own runs as usual
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self._futures.clear()

    def result(self, request: pytest.FixtureRequest) -> tuple[T, Path]:
        """The calling test's job: its result and its directory."""
        name = request.node.name
        if name not in self._futures:
            raise KeyError(f"{name}: no job registered for this test")
        assert self._root is not None
        return self._futures[name].result(), self._root / _safe(name)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def jobs_fixture(jobs: ModuleJobs[Any], prefix: str) -> Callable[..., Any]:
    """The module-scoped fixture that starts `jobs` (name it in the module: `jobs = ...`)."""

    @pytest.fixture(scope="module")
    def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
        with jobs.started(request, tmp_path_factory.mktemp(prefix)) as started:
            yield started

    return fixture
