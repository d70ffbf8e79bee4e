"""Top-K verification: the same schedule replayed on real Triton with each candidate's configuration.

Embedded (default): the repository is copied (artifacts hard-linked, so nothing large is duplicated), the candidate
is written into the copy's ``config.pbtxt`` s with :meth:`ServingConfig.apply_to_repo`, and a real tritonserver serves
the copy on loopback. External (``--url``): each model is reloaded on that server with the candidate's settings
(Triton's explicit model control: ``load_model`` with a config override), which needs a server started with
``--model-control-mode=explicit``. The measured and the simulated summaries sit side by side.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from serving_bench.errors import ServerError
from serving_bench.export.repository import list_entries
from serving_bench.files import publish_folder
from serving_bench.run.results import write_results
from serving_bench.run.schedule import Schedule
from serving_bench.serve.control import Control
from serving_bench.serve.server import MAX_RESTARTS, connect
from serving_bench.serving_config import ServingConfig, apply_model_serving
from serving_bench.tune import adapters


def copy_repo(repo: str | Path, dest: str | Path, models: list[str] | None = None) -> Path:
    """Copy ``repo`` (or the named entries) to ``dest``; files are hard-linked where possible, configs rewritten
    later by rename, so the original is never modified."""
    repo, dest = Path(repo), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for name in models or list_entries(repo):
        shutil.copytree(repo / name, dest / name, copy_function=link, symlinks=True)
    for extra in ("manifest.json",):
        if (repo / extra).is_file():
            shutil.copy2(repo / extra, dest / extra)
    return dest


def write_tuned_repo(repo: str | Path, config: ServingConfig, dest: str | Path) -> Path:
    """A copy of ``repo`` with ``config`` applied, written to a temporary folder and renamed to ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        copy_repo(repo, tmp / "repo")
        config.apply_to_repo(tmp / "repo")
        publish_folder(tmp / "repo", dest, replace=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def apply_to_server(url: str, config: ServingConfig) -> None:
    """Reload each model of ``config`` on the external server at gRPC ``url`` with its settings."""
    with Control(url) as control:
        for model in config.models:
            try:
                control.load_model(model.name, apply_model_serving(control.model_config(model.name), model))
            except ServerError as err:
                raise ServerError(f"could not reload {model.name} on {url} with the candidate settings ({err}); "
                                  "the server must run with --model-control-mode=explicit") from None


def verify_candidate(config: ServingConfig, schedule: Schedule, slos: Mapping, *, repo: str | Path | None,
                     url: str | None, out_dir: Path, progress=None, log=None) -> dict:
    """Replay ``schedule`` on Triton configured with ``config``; writes the results folder ``out_dir`` and returns
    its summary. On the embedded server a replay cut short by the server or a model instance dying is run again on a
    new server (at most ``MAX_RESTARTS`` times, each noted through ``log`` and in the records' ``restarts``); an
    external server (``url``) is not ours to restart."""
    served = list(schedule.models)
    with tempfile.TemporaryDirectory(prefix="serving-bench-verify-") as tmp:
        copy = None
        if not url:
            copy = copy_repo(repo, Path(tmp) / "repo")
            config.apply_to_repo(copy)
        restarts: list[str] = []
        while True:
            with connect(copy, url=url, models=served,
                         threads_per_instance=config.threads_per_instance or None) as server:
                if url:
                    apply_to_server(url, config)
                records = adapters.replay(server, schedule, progress)
            reason = records.info.stop_reason or ""
            if url or not records.info.partial or reason.startswith("interrupted") or len(restarts) >= MAX_RESTARTS:
                break
            restarts.append(f"the replay stopped early ({reason}); replayed again on a new server")
            (log or print)(f"note: {restarts[-1]} (restart {len(restarts)} of at most {MAX_RESTARTS})")
    records = records.with_info(restarts=tuple(restarts))
    return write_results(out_dir, records, slos={m: dict(s) for m, s in slos.items()})


def compare(simulated: dict, measured: dict) -> dict:
    """Per-model figures of both summaries (``{"simulated": {m: {...}}, "measured": {m: {...}}}``)."""
    keys = ("p50_s", "p99_s", "throughput_rps", "mean_exec_batch")
    return {side: {m: {k: s.get(k) for k in keys} for m, s in summ["models"].items()}
            for side, summ in (("simulated", simulated), ("measured", measured))}
