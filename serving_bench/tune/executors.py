"""Executors run a batch of evaluations and return their results in order; keyed by string: ``local``, ``ray``.

The search proposes a fixed-size batch, an executor evaluates it, and the results are observed in proposal order, so
the outcome does not depend on which executor ran it, nor on how many workers (the simulator is deterministic for a
given seed). ``local`` runs in this process, or with ``workers > 1`` in that many worker processes on this machine
(spawned, so nothing of this process's threads is inherited; the shared object is sent to each once; a worker
ends itself when this process is gone, however it ended).
``ray`` runs each evaluation as a Ray task: on a local Ray started on this machine (``num_cpus`` workers), or on an
existing cluster given by ``address`` (``ray://host:10001`` or ``host:6379``).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import serving_bench
from serving_bench.errors import InputError


class Executor:
    """Maps ``fn`` over ``items``; ``shared`` is a large read-only object every call receives (sent once)."""

    name = "base"

    def imap(self, fn: Callable[[Any, Any], Any], shared: Any, items: Sequence[Any]) -> Iterator[Any]:
        """Yield ``fn(shared, item)`` for each item, in order, each as soon as it (and those before it) is done."""
        raise NotImplementedError

    def map(self, fn: Callable[[Any, Any], Any], shared: Any, items: Sequence[Any]) -> list[Any]:
        return list(self.imap(fn, shared, items))

    def close(self) -> None:
        """Release what the executor started."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class LocalConfig:
    """``workers``: 1 — in this process, one evaluation after another; N > 1 — N worker processes."""

    workers: int = 1


_WORKER_SHARED: Any = None  # a worker process's copy of the shared object (set once, by _init_worker)
PARENT_CHECK_S = 1.0  # how often a worker looks for its parent


def _init_worker(shared: Any) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = shared
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="exit-with-parent", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone (killed without a chance to shut the pool down: SIGKILL, or SIGTERM
    outside a handler); an orphaned worker would otherwise wait for work forever, holding its copy of the load."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def _worker_call(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_WORKER_SHARED, item)


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, config: LocalConfig = LocalConfig()):
        self.config = config
        self._pool = None
        self._shared_obj = None

    def imap(self, fn, shared, items):
        if self.config.workers <= 1:
            for item in items:
                yield fn(shared, item)
            return
        if self._pool is None or self._shared_obj is not shared:
            self.close()
            self._pool = ProcessPoolExecutor(self.config.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(shared,))
            self._shared_obj = shared
        futures = [self._pool.submit(_worker_call, fn, item) for item in items]
        for future in futures:
            yield future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = self._shared_obj = None


@dataclass(frozen=True)
class RayConfig:
    """``address``: an existing cluster (None starts a local Ray on this machine with ``num_cpus`` CPUs)."""

    address: str | None = None
    num_cpus: int | None = None


def _ray_call(fn, shared, item):
    return fn(shared, item)


class RayExecutor(Executor):
    """Evaluations as Ray tasks; the shared object is put in the object store once per executor."""

    name = "ray"

    def __init__(self, config: RayConfig = RayConfig()):
        self.config = config
        self._started = False
        self._remote = None
        self._shared_ref = None
        self._shared_obj = None

    def _ensure(self):
        try:
            import ray  # heavy (~1 s) and only for this executor
        except ImportError as err:  # pragma: no cover - install problem
            raise RuntimeError("the ray executor needs `pip install ray==2.60.0`") from err
        if not ray.is_initialized():
            kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if self.config.address:
                kwargs["address"] = self.config.address
            else:
                kwargs.update(num_cpus=self.config.num_cpus, _node_ip_address="127.0.0.1")
            root = str(Path(serving_bench.__file__).resolve().parents[1])
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}}
            ray.init(**kwargs)
            self._started = True
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1)(_ray_call)
        return ray

    def imap(self, fn, shared, items):
        ray = self._ensure()
        if self._shared_obj is not shared:
            self._shared_ref, self._shared_obj = ray.put(shared), shared
        refs = [self._remote.remote(fn, self._shared_ref, item) for item in items]
        for ref in refs:
            yield ray.get(ref)

    def close(self) -> None:
        if self._started:
            import ray  # heavy; already loaded by _ensure
            ray.shutdown()
            self._started = False
        self._remote = self._shared_ref = self._shared_obj = None


EXECUTORS: dict[str, tuple[type, type]] = {"local": (LocalExecutor, LocalConfig), "ray": (RayExecutor, RayConfig)}


def make_executor(name: str, **options) -> Executor:
    """The executor registered as ``name`` with its config built from ``options`` (unknown keys are ignored)."""
    if name not in EXECUTORS:
        raise InputError("--executor", None, f"{name!r}: expected one of {', '.join(EXECUTORS)}")
    cls, config_cls = EXECUTORS[name]
    fields = config_cls.__dataclass_fields__
    return cls(config_cls(**{k: v for k, v in options.items() if k in fields}))
