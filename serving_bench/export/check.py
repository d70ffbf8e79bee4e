"""``serving-bench check-repo <repo>``: every problem of a model repository, one line each, non-zero exit.

Each line is ``<file>: <field>: <what was expected>`` (an :class:`InputError` line; parse errors name the line).
What is checked, per entry folder:

- the folder name is a safe entry name and ``config.pbtxt`` parses as a Triton ``ModelConfig``; its ``name`` (if set)
  is the folder name; ``platform``/``backend`` is one this tool writes;
- ``max_batch_size`` >= 0 (and > 0 with ``dynamic_batching``), inputs and outputs are declared with a data type,
  unique names and dims > 0 (or -1); instance counts >= 1 (0 = unset = 1);
- the version folder ``1/`` holds the artifact (``model.pt``, ``model.onnx``, ``model.plan``; ``model.py`` for the
  python backend, plus ``model.so`` for TVM entries);
- the artifact agrees with the config: ONNX graph inputs/outputs (names, element types, dims after the batch axis)
  are read with ``onnx``; TorchScript forward argument names are read from the archive's pickle opcodes without
  unpickling anything; for every artifact the manifest's sha256 (when recorded) must match the file and the
  manifest's recorded I/O must match the config;
- ensembles: every step names an existing entry, maps only tensors that member declares, reads only tensors that are
  ensemble inputs or another step's outputs; every ensemble output is produced; member I/O shapes match;
- a variant's config (parameter ``variant``) names its framework, and its runtime fields (threads, graph level,
  execution mode) are the ones that variant writes;
- the manifest lists no exported entry whose folder is missing.
"""

from __future__ import annotations

import argparse
import io
import pickletools
import zipfile
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_bench.errors import InputError
from serving_bench.export.frameworks import (FRAMEWORKS, PLATFORM_ARTIFACTS, PLATFORM_TO_FRAMEWORK, PYTHON_ARTIFACT,
                                             native_platform)
from serving_bench.export.repository import (CONFIG_NAME, MANIFEST_NAME, TRITON_TO_NUMPY, ModelConfig,
                                             check_entry_name, file_sha256, load_manifest, read_config)
from serving_bench.export.variants import VARIANT_PARAMETER, Variant, loader_settings

# platform (or the python backend) -> artifact file in the version folder
ARTIFACTS = {**PLATFORM_ARTIFACTS, "python": PYTHON_ARTIFACT}
ONNX_TO_NUMPY = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}


class Problems:
    """Collects one-line problems for one file."""

    def __init__(self):
        self.items: list[InputError] = []

    def add(self, source, field: str | None, expected: str) -> None:
        self.items.append(InputError(source, field, expected))


def check_repo(repo: str | Path) -> tuple[list[InputError], list[str]]:
    """All problems of ``repo`` (empty when it is fine) and the names of the entries found."""
    repo = Path(repo)
    problems = Problems()
    if not repo.is_dir():
        problems.add(repo, None, "model repository folder does not exist")
        return problems.items, []
    try:
        manifest = load_manifest(repo)
    except InputError as err:
        problems.items.append(err)
        manifest = {"entries": {}}
    entries = manifest.get("entries", {})
    configs: dict[str, ModelConfig] = {}
    unreadable: set[str] = set()  # already reported; ensembles naming them get no second line
    folders = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    for folder in folders:
        config_path = folder / CONFIG_NAME
        try:
            check_entry_name(folder.name, folder, "folder name")
        except InputError as err:
            problems.items.append(err)
            continue
        if not config_path.is_file():
            problems.add(config_path, None, "missing: every model folder needs a config.pbtxt")
            continue
        try:
            configs[folder.name] = read_config(config_path)
        except InputError as err:
            problems.items.append(err)
            unreadable.add(folder.name)
    for name, config in configs.items():
        _check_entry(repo / name, config, entries.get(name), problems)
    for name, config in configs.items():
        if config.platform == "ensemble":
            _check_ensemble(repo / name, config, configs, unreadable, problems)
    for name, record in entries.items():
        if isinstance(record, dict) and record.get("status") == "exported" and not (repo / name).is_dir():
            problems.add(repo / MANIFEST_NAME, f"entries.{name}", "lists an exported entry whose folder is missing")
    return problems.items, sorted(configs)


def _kind(config: ModelConfig) -> str:
    """platform, or python, or the platform a native backend name stands for; '' if none."""
    if config.platform:
        return config.platform
    return native_platform("", config.backend) or config.backend


def _check_tensors(path: Path, config: ModelConfig, which: str, problems: Problems) -> None:
    tensors = getattr(config, which)
    if not tensors:
        problems.add(path, which, f"no {which}s declared; expected at least one")
    seen = set()
    for i, t in enumerate(tensors):
        field = f"{which}[{i}]"
        if not t.name:
            problems.add(path, f"{field}.name", "expected a tensor name")
        if t.name in seen:
            problems.add(path, f"{field}.name", f"{t.name!r} declared twice; expected unique {which} names")
        seen.add(t.name)
        if t.data_type == mc.TYPE_INVALID:
            problems.add(path, f"{field}.data_type", "expected a data type such as TYPE_FP32")
        if any(d == 0 or d < -1 for d in t.dims):
            problems.add(path, f"{field}.dims", f"{list(t.dims)}: expected sizes > 0 or -1 (variable)")


def _check_entry(entry: Path, config: ModelConfig, record: dict | None, problems: Problems) -> None:
    path = entry / CONFIG_NAME
    kind = _kind(config)
    if config.name and config.name != entry.name:
        problems.add(path, "name", f"{config.name!r} differs from its folder name {entry.name!r}")
    if kind not in ARTIFACTS and kind != "ensemble":
        problems.add(path, "platform" if config.platform else "backend",
                     f"{kind or 'none'!r}: expected platform pytorch_libtorch, onnxruntime_onnx, tensorrt_plan or "
                     f"ensemble, or backend python")
    if VARIANT_PARAMETER in config.parameters:
        _check_variant(path, config, problems)
    if config.max_batch_size < 0:
        problems.add(path, "max_batch_size", f"{config.max_batch_size}: expected >= 0")
    if config.max_batch_size == 0 and config.HasField("dynamic_batching"):
        problems.add(path, "dynamic_batching", "set while max_batch_size is 0; expected max_batch_size >= 1")
    for which in ("input", "output"):
        _check_tensors(path, config, which, problems)
    for i, group in enumerate(config.instance_group):
        if group.count < 0:  # 0 is proto3's "unset", which Triton reads as 1
            problems.add(path, f"instance_group[{i}].count", f"{group.count}: expected >= 1")
    versions = sorted(p for p in entry.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        problems.add(entry, "version folder", "missing: expected a numeric version folder such as 1/")
        return
    if kind == "ensemble" or kind not in ARTIFACTS:
        return
    version = versions[-1]
    artifacts = [config.default_model_filename or ARTIFACTS[kind]]
    if kind == "python" and config.parameters["framework"].string_value == "tvm":
        artifacts.append(config.parameters["artifact"].string_value or FRAMEWORKS["tvm"].artifact)
    for artifact in artifacts:
        if not (version / artifact).is_file():
            problems.add(version / artifact, None, f"missing: the {kind} entry needs its artifact {artifact}")
    artifact_path = version / artifacts[-1]
    if not artifact_path.is_file():
        return
    if kind == "onnxruntime_onnx":
        _check_onnx_io(artifact_path, path, config, problems)
    elif kind == "pytorch_libtorch":
        _check_torchscript_io(artifact_path, path, config, problems)
    if record:
        _check_against_manifest(entry, config, record, problems)


def _check_variant(path: Path, config: ModelConfig, problems: Problems) -> None:
    """The ``variant`` parameter parses, names the entry's framework, and the runtime fields agree with it."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    try:
        variant = Variant.parse(params[VARIANT_PARAMETER], "parameters.variant")
    except InputError as err:
        problems.add(path, "parameters.variant", err.expected)
        return
    framework = PLATFORM_TO_FRAMEWORK.get(native_platform(config.platform, config.backend) or "",
                                          params.get("framework", ""))
    if variant.framework != framework:
        problems.add(path, "parameters.variant", f"{variant.id!r} is a {variant.framework} variant; expected one of "
                                                 f"{framework or 'this entry'}'s")
        return
    found = loader_settings(framework, params, config.optimization.graph.level)
    if found != variant.loader_settings():
        problems.add(path, "parameters", f"runtime settings {found} differ from variant {variant.id}'s "
                                         f"{variant.loader_settings()}")


def _batch_dims(config: ModelConfig, dims: list[int]) -> list[int]:
    return dims[1:] if config.max_batch_size > 0 else dims


def _check_onnx_io(onnx_path: Path, path: Path, config: ModelConfig, problems: Problems) -> None:
    import onnx  # heavy (~0.5 s): only when an ONNX entry is checked

    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as err:  # noqa: BLE001 - any decode failure is one problem line
        problems.add(onnx_path, None, f"not a readable ONNX model ({type(err).__name__}: {err})")
        return
    initializers = {i.name for i in graph.initializer}
    declared = {"input": [i for i in graph.input if i.name not in initializers], "output": list(graph.output)}
    for which, values in declared.items():
        model = {v.name: v for v in values}
        for i, t in enumerate(getattr(config, which)):
            if t.name not in model:
                problems.add(path, f"{which}[{i}].name", f"{t.name!r} is not a {which} of {onnx_path.name}; "
                                                        f"expected one of {', '.join(model) or 'none'}")
                continue
            tensor_type = model[t.name].type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
            if config.max_batch_size > 0 and dims and dims[0] not in (-1,):
                problems.add(path, f"{which}[{i}].dims", f"{onnx_path.name} has a fixed batch axis {dims[0]}; "
                                                        f"expected a dynamic one with max_batch_size > 0")
            want = _batch_dims(config, dims)
            if list(t.dims) != want and not (-1 in want and len(want) == len(t.dims)):
                problems.add(path, f"{which}[{i}].dims", f"{list(t.dims)}: {onnx_path.name} has {want}")
            dtype = ONNX_TO_NUMPY.get(tensor_type.elem_type)
            if dtype and TRITON_TO_NUMPY.get(t.data_type) != dtype:
                problems.add(path, f"{which}[{i}].data_type",
                             f"{mc.DataType.Name(t.data_type)}: {onnx_path.name} has {dtype}")


def torchscript_forward_args(archive: Path) -> list[str] | None:
    """Argument names of the top module's ``forward`` in a TorchScript archive, without unpickling.

    The class of the top module is the first global referenced by ``data.pkl`` (read with ``pickletools``, which only
    decodes opcodes); its source is under ``code/`` in the archive.
    """
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
        data = next((n for n in names if n.endswith("/data.pkl") and n.count("/") == 1), None)
        if data is None:
            return None
        strings = []
        for op, arg, _ in pickletools.genops(io.BytesIO(zf.read(data))):
            if op.name == "GLOBAL":
                strings = arg.split(" ")
                break
            if isinstance(arg, str):
                strings.append(arg)
            if op.name == "STACK_GLOBAL":
                strings = strings[-2:]
                break
        if len(strings) != 2:
            return None
        module, cls = strings
        prefix = data.split("/")[0]
        source_name = f"{prefix}/code/{module.replace('.', '/')}.py"
        if source_name not in names:
            return None
        source = zf.read(source_name).decode("utf-8", "replace")
    marker = f"class {cls}("
    body = source[source.find(marker):] if marker in source else ""
    start = body.find("def forward(")
    if start < 0:
        return None
    signature = body[start + len("def forward("):body.find(")", start) + 1]
    args = [a.split(":")[0].strip() for a in signature.rstrip(")").split(",")]
    return [a for a in args if a and a != "self"]


def _check_torchscript_io(archive: Path, path: Path, config: ModelConfig, problems: Problems) -> None:
    try:
        args = torchscript_forward_args(archive)
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        problems.add(archive, None, f"not a readable TorchScript archive ({type(err).__name__}: {err})")
        return
    if args is None:
        return  # layout not recognised: names cannot be checked from the archive alone
    for i, t in enumerate(config.input):
        if t.name not in args and not t.name.startswith(tuple(f"{a}__" for a in ("INPUT", "input"))):
            problems.add(path, f"input[{i}].name", f"{t.name!r} is not a forward argument of {archive.name}; "
                                                  f"expected one of {', '.join(args) or 'none'}")


def _check_against_manifest(entry: Path, config: ModelConfig, record: dict, problems: Problems) -> None:
    path = entry / CONFIG_NAME
    artifact, digest = record.get("artifact"), record.get("sha256")
    if artifact and digest and (entry / artifact).is_file() and file_sha256(entry / artifact) != digest:
        problems.add(entry / artifact, None, f"sha256 differs from manifest.json entries.{entry.name}.sha256; "
                                             f"expected the exported file (re-export with --overwrite)")
    for which in ("input", "output"):
        recorded = record.get(f"{which}s")
        if not isinstance(recorded, list):
            continue
        have = [(t.name, TRITON_TO_NUMPY.get(t.data_type), list(t.dims)) for t in getattr(config, which)]
        want = [(r.get("name"), r.get("dtype"), list(r.get("shape", []))) for r in recorded]
        if have != want:
            problems.add(path, which, f"{have} differ from the exported artifact's {want} (manifest.json)")


def _check_ensemble(entry: Path, config: ModelConfig, configs: dict[str, ModelConfig], unreadable: set[str],
                    problems: Problems) -> None:
    path = entry / CONFIG_NAME
    steps = config.ensemble_scheduling.step
    if not steps:
        problems.add(path, "ensemble_scheduling.step", "expected at least one step")
        return
    available = {t.name: t for t in config.input}
    produced: dict[str, str] = {}
    for i, step in enumerate(steps):
        for key, value in step.output_map.items():
            produced[value] = step.model_name
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        member = configs.get(step.model_name)
        if step.model_name in unreadable:
            continue
        if member is None:
            problems.add(path, f"{field}.model_name", f"{step.model_name!r}: expected an entry of this repository")
            continue
        member_inputs = {t.name: t for t in member.input}
        member_outputs = {t.name for t in member.output}
        for key, value in step.input_map.items():
            if key not in member_inputs:
                problems.add(path, f"{field}.input_map[{key}]", f"{step.model_name} has no input {key!r}; "
                                                                f"expected one of {', '.join(member_inputs)}")
            if value not in available and value not in produced:
                problems.add(path, f"{field}.input_map[{key}]", f"{value!r} is neither an ensemble input nor "
                                                                f"another step's output")
            elif value in available and key in member_inputs and \
                    list(available[value].dims) != list(member_inputs[key].dims):
                problems.add(path, f"{field}.input_map[{key}]",
                             f"ensemble input dims {list(available[value].dims)}; {step.model_name} expects "
                             f"{list(member_inputs[key].dims)}")
        for key in member_inputs:
            if key not in step.input_map:
                problems.add(path, f"{field}.input_map", f"{step.model_name}'s input {key!r} is not mapped")
        for key in step.output_map:
            if key not in member_outputs:
                problems.add(path, f"{field}.output_map[{key}]", f"{step.model_name} has no output {key!r}; "
                                                                 f"expected one of {', '.join(member_outputs)}")
    for i, t in enumerate(config.output):
        if t.name not in produced:
            problems.add(path, f"output[{i}]", f"{t.name!r} is produced by no step's output_map")
    used = {v for step in steps for v in step.input_map.values()}
    for i, t in enumerate(config.input):
        if t.name not in used:
            problems.add(path, f"input[{i}]", f"{t.name!r} is read by no step")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", nargs="?", default="model_repo", help="model repository (default: model_repo)")


def main(args: argparse.Namespace) -> int:
    if not Path(args.repo).is_dir():  # bad input, not a repository with problems
        raise InputError(args.repo, None, "model repository folder does not exist")
    problems, names = check_repo(args.repo)
    for problem in problems:
        print(problem.line())
    if problems:
        print(f"{args.repo}: {len(problems)} problem(s) in {len(names)} entries")
        return 1
    print(f"{args.repo}: {len(names)} entries ok")
    return 0
