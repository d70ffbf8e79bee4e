"""Variants: a framework and its settings, the candidates a model is exported, served and measured as.

    v = Variant.parse("onnxruntime:opt=basic,intra=2,int8")
    v.id                       # "onnxruntime:opt=basic,intra=2,int8" (canonical: fixed order, defaults left out)
    v.entry_name("resnet50")   # "resnet50_onnxruntime_opt-basic_intra-2_int8" (default variant: resnet50_onnxruntime)
    parse_variants("onnxruntime,onnxruntime:int8,tvm:trials=64")   # a CLI list -> [Variant, ...]

Settings (``framework:setting,setting,...``):

======================  =============================================  ======================================
setting                 meaning                                        frameworks
======================  =============================================  ======================================
``intra=N``             intra-op threads of each instance              torchscript, onnxruntime, tvm
``inter=N``             inter-op threads (ONNX Runtime: with mode=par)  torchscript, onnxruntime
``opt=LEVEL``           graph optimisation: disable|basic|extended|all  onnxruntime (default all)
``mode=seq|par``        execution mode: sequential or parallel          onnxruntime (default seq)
``trials=N``            MetaSchedule tuning with a budget of N trials   tvm (default 0: untuned)
``graphs``              CUDA graphs per batch size (a GPU only)         torchscript
``fp32|fp16|int8``      precision; fp16 on a GPU only; int8 = ONNX      fp16: all (tvm: never served, it
                        Runtime's dynamic quantisation, gated           runs on the CPU); int8: onnxruntime
======================  =============================================  ======================================

Where the settings live: *runtime* settings (threads, graph level, execution mode, CUDA graphs) do not change the
artifact; they are written into the entry's ``config.pbtxt`` under the names the native Triton backends read
(ONNX Runtime: ``parameters`` ``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode`` and
``optimization.graph.level``; PyTorch: ``INTRA_OP_THREAD_COUNT``, ``INTER_OP_THREAD_COUNT``), so a full Triton
honours them too, and this tool's runners read the same fields (:func:`loader_settings`). *Artifact* settings
(precision, TVM trials) need an artifact of their own: :meth:`Variant.artifact_variant` is the variant whose artifact a
variant uses, and variants that share one share the file (a hard link), so a runtime variant costs no re-export.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from serving_bench.errors import InputError
from serving_bench.export.frameworks import FRAMEWORKS

PRECISION_FLAGS = ("fp32", "fp16", "int8")
GRAPH_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("seq", "par")
# Triton's onnxruntime backend: optimization.graph.level -> ORT level (anything else, 0 or absent, is "all")
TRITON_GRAPH_LEVEL = {"basic": -1, "extended": 1, "disable": 2}
# runtime setting -> the config parameter each framework's Triton backend reads it from (tvm: this tool's runner)
PARAMETERS = {
    "onnxruntime": {"intra": "intra_op_thread_count", "inter": "inter_op_thread_count", "mode": "execution_mode"},
    "torchscript": {"intra": "INTRA_OP_THREAD_COUNT", "inter": "INTER_OP_THREAD_COUNT"},
    "tvm": {"intra": "intra_op_thread_count"},
}
SESSION_SETTINGS = ("onnxruntime",)  # frameworks whose runtime settings belong to a session, not the process
VARIANT_PARAMETER = "variant"  # the config parameter holding the entry's variant id
CUDA_GRAPHS_PARAMETER = "cuda_graphs"  # read by serve/runners/native_model.py
# setting names each framework takes
ALLOWED = {
    "torchscript": ("intra", "inter", "graphs", "fp32", "fp16"),
    "onnxruntime": ("intra", "inter", "opt", "mode", "fp32", "fp16", "int8"),
    "tvm": ("intra", "trials", "fp32", "fp16"),
    "tensorrt": ("fp32", "fp16"),
}
_SEPARATORS = re.compile(r"[\s,;]+")


@dataclass(frozen=True, repr=False)
class Variant:
    """One candidate: ``framework`` with its settings. 0 threads = not set (the server's ``threads_per_instance``
    for intra-op threads, the runtime's default for inter-op); ``tune_trials`` 0 = untuned TVM."""

    framework: str
    precision: str = "fp32"
    intra_threads: int = 0
    inter_threads: int = 0
    graph_level: str = "all"
    execution_mode: str = "seq"
    tune_trials: int = 0
    cuda_graphs: bool = False

    @classmethod
    def parse(cls, text: str, source: str = "--variants") -> "Variant":
        """``framework[:setting,...]``; anything else raises a one-line :class:`InputError`."""
        name, _, rest = text.strip().partition(":")
        framework = _framework(name, text, source)
        fields: dict[str, object] = {}
        for token in (t for t in _SEPARATORS.split(rest) if t):
            key, eq, value = token.partition("=")
            flag = key in PRECISION_FLAGS or key == "graphs"
            if key not in ALLOWED[framework] or bool(eq) == flag:
                raise InputError(source, text, f"{token!r} is not a setting of {framework}; expected "
                                               f"{', '.join(_setting_forms(ALLOWED[framework]))}")
            field, parsed = _parse_value(key, value, text, source)
            if field in fields:
                raise InputError(source, text, f"{field.replace('_', ' ')} given twice; expected each setting once")
            fields[field] = parsed
        return cls(framework, **fields).checked(text, source)

    def checked(self, text: str | None = None, source: str = "--variants") -> "Variant":
        """Itself, if its settings are ones its framework takes and fit together (ONNX Runtime's inter-op threads
        need ``mode=par``); else a one-line :class:`InputError`."""
        text = text or self.id
        allowed = ALLOWED.get(self.framework)
        if allowed is None:
            _framework(self.framework, text, source)
        used = [s.partition("=")[0] for s in self.settings]
        bad = [s for s in used if s not in allowed]
        if bad:
            raise InputError(source, text, f"{bad[0]} is not a setting of {self.framework}; expected "
                                           f"{', '.join(_setting_forms(allowed))}")
        if self.framework == "onnxruntime" and self.inter_threads and self.execution_mode != "par":
            raise InputError(source, text, "inter=N needs mode=par: ONNX Runtime runs the graph on inter-op threads "
                                           "only in parallel mode")
        return self

    @property
    def settings(self) -> tuple[str, ...]:
        """The non-default settings in canonical order: opt, mode, intra, inter, trials, graphs, precision."""
        out = []
        if self.graph_level != "all":
            out.append(f"opt={self.graph_level}")
        if self.execution_mode != "seq":
            out.append(f"mode={self.execution_mode}")
        out += [f"{k}={v}" for k, v in (("intra", self.intra_threads), ("inter", self.inter_threads),
                                        ("trials", self.tune_trials)) if v]
        if self.cuda_graphs:
            out.append("graphs")
        if self.precision != "fp32":
            out.append(self.precision)
        return tuple(out)

    @property
    def id(self) -> str:
        """The stable string id (:meth:`parse` of it gives this variant back)."""
        return self.framework + (":" + ",".join(self.settings) if self.settings else "")

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Variant({self.id!r})"

    @property
    def is_default(self) -> bool:
        return self == Variant(self.framework)

    def entry_name(self, model: str) -> str:
        """``<model>_<framework>`` for the default variant, else a suffix per setting (``_intra-2_int8``)."""
        return "_".join([model, self.framework, *(s.replace("=", "-") for s in self.settings)])

    def artifact_variant(self) -> "Variant":
        """The variant with only the settings that change the artifact (precision, TVM trials): variants with the
        same one share an artifact."""
        return Variant(self.framework, precision=self.precision, tune_trials=self.tune_trials)

    @property
    def io_precision(self) -> str:
        """The precision of the entry's float tensors (int8 quantises weights; its inputs and outputs stay fp32)."""
        return "fp16" if self.precision == "fp16" else "fp32"

    def unavailable_reason(self, gpu: bool) -> str | None:
        """Why this variant cannot run on this host (``gpu``: whether a CUDA GPU is visible), else None. The
        framework's own reason (TensorRT not importable, ...) is checked separately."""
        if self.precision == "fp16" and not gpu:
            return "fp16 variants run only on a GPU, and no CUDA GPU is visible here"
        if self.precision == "fp16" and self.framework == "tvm":
            return "TVM compiles for the host CPU here, and fp16 variants run only on a GPU"
        if self.cuda_graphs and not gpu:
            return "CUDA graphs run only on a GPU, and no CUDA GPU is visible here"
        if self.precision == "int8" and gpu:
            return "int8 dynamic quantisation runs on ONNX Runtime's CPU provider; this host serves on its GPU"
        return None

    def config_parameters(self) -> dict[str, str]:
        """The config ``parameters`` this variant's runtime settings and id are written as."""
        names = PARAMETERS.get(self.framework, {})
        params = {VARIANT_PARAMETER: self.id}
        for setting, value in (("intra", self.intra_threads), ("inter", self.inter_threads)):
            if value:
                params[names[setting]] = str(value)
        if self.framework == "onnxruntime" and self.execution_mode == "par":
            params[names["mode"]] = "1"
        if self.cuda_graphs:
            params[CUDA_GRAPHS_PARAMETER] = "all"
        return params

    def apply_to_config(self, config) -> None:
        """Write the runtime settings into ``config`` (a ``ModelConfig``): :meth:`config_parameters` and, for ONNX
        Runtime, ``optimization.graph.level``. Settings of another variant there before are removed first."""
        for name in {n for names in PARAMETERS.values() for n in names.values()} | {CUDA_GRAPHS_PARAMETER}:
            if name in config.parameters:
                del config.parameters[name]
        for key, value in self.config_parameters().items():
            config.parameters[key].string_value = value
        config.optimization.ClearField("graph")
        if self.graph_level in TRITON_GRAPH_LEVEL:
            config.optimization.graph.level = TRITON_GRAPH_LEVEL[self.graph_level]

    def loader_settings(self) -> dict:
        """The :func:`~serving_bench.export.frameworks.load_predictor` keyword arguments of the runtime settings:
        what a runner reads back from the config this variant wrote (:func:`loader_settings`)."""
        level = TRITON_GRAPH_LEVEL.get(self.graph_level, 0)
        return loader_settings(self.framework, self.config_parameters(), level)

    def parity_settings(self) -> dict:
        """The runtime settings the exporter's parity check can apply: ONNX Runtime's are per session; torch's and
        TVM's thread counts are per process, so they are applied only in the serving process (they change how the
        work is split, not what is computed)."""
        return self.loader_settings() if self.framework in SESSION_SETTINGS else {}


def _framework(name: str, text: str, source: str) -> str:
    name = name.strip()
    if name not in ALLOWED:
        valid = ", ".join(f for f in FRAMEWORKS if f in ALLOWED)
        raise InputError(source, text or "(empty)", f"unknown framework {name!r}; expected one of {valid}, "
                                                    f"optionally followed by :settings")
    return name


def _setting_forms(allowed: Iterable[str]) -> list[str]:
    forms = {"intra": "intra=N", "inter": "inter=N", "opt": f"opt={'|'.join(GRAPH_LEVELS)}",
             "mode": f"mode={'|'.join(EXECUTION_MODES)}", "trials": "trials=N", "graphs": "graphs"}
    return [forms.get(a, a) for a in allowed]


def _parse_value(key: str, value: str, text: str, source: str) -> tuple[str, object]:
    """(dataclass field, parsed value) of one setting."""
    if key in PRECISION_FLAGS:
        return "precision", key
    if key == "graphs":
        return "cuda_graphs", True
    if key == "opt":
        if value not in GRAPH_LEVELS:
            raise InputError(source, text, f"opt={value!r}: expected one of {', '.join(GRAPH_LEVELS)}")
        return "graph_level", value
    if key == "mode":
        if value not in EXECUTION_MODES:
            raise InputError(source, text, f"mode={value!r}: expected seq or par")
        return "execution_mode", value
    minimum = 0 if key == "trials" else 1
    if not value.isdigit() or int(value) < minimum:
        raise InputError(source, text, f"{key}={value!r}: expected an integer >= {minimum}")
    return {"intra": "intra_threads", "inter": "inter_threads", "trials": "tune_trials"}[key], int(value)


def parse_variants(values: str | Iterable[str], source: str = "--variants") -> list[Variant]:
    """A list of variants, each once, in order. A string is split at commas, semicolons and spaces; a token that is a
    framework name or holds ``:`` starts a new variant, any other token is a setting of the one before
    (``onnxruntime:opt=basic,intra=2,tvm`` is two variants)."""
    tokens = [t for t in _SEPARATORS.split(values)] if isinstance(values, str) else \
        [t for v in values for t in _SEPARATORS.split(v)]
    groups: list[list[str]] = []
    for token in (t for t in tokens if t):
        if ":" in token or token in FRAMEWORKS or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    if not groups:
        raise InputError(source, None, "expected at least one variant, e.g. onnxruntime,onnxruntime:int8")
    return list(dict.fromkeys(Variant.parse(",".join(g), source) for g in groups))


def auto_variants(frameworks: Iterable[str], *, gpu: bool, tvm_trials: int = 0) -> list[Variant]:
    """The candidates ``--variants auto`` exports: each framework's default, ONNX Runtime's int8 (CPU) and basic
    graph optimisation, tuned TVM when ``tvm_trials`` > 0, and on a GPU fp16 and TorchScript's CUDA graphs. Thread
    counts are runtime settings, searched at serve time rather than exported one entry each."""
    out: list[Variant] = []
    for name in frameworks:
        out.append(Variant(name))
        if name == "onnxruntime":
            out += [Variant(name, graph_level="basic")] + ([] if gpu else [Variant(name, precision="int8")])
        if name == "tvm" and tvm_trials > 0:
            out.append(Variant(name, tune_trials=tvm_trials))
        if gpu and name in ("torchscript", "onnxruntime", "tensorrt"):
            out.append(Variant(name, precision="fp16"))
        if gpu and name == "torchscript":
            out.append(Variant(name, cuda_graphs=True))
    return list(dict.fromkeys(out))


def loader_settings(framework: str, parameters: Mapping[str, str], graph_level: int | str | None = None) -> dict:
    """The keyword arguments of :func:`serving_bench.export.frameworks.load_predictor` that an entry's config asks
    for (its ``parameters`` as strings, its ``optimization.graph.level``): ``threads``, ``inter_threads``,
    ``graph_optimization_level``, ``execution_mode``; only those the config sets."""
    names = PARAMETERS.get(framework, {})
    out: dict = {}
    for setting, kwarg in (("intra", "threads"), ("inter", "inter_threads")):
        value = parameters.get(names.get(setting, ""), "")
        if value and int(value) > 0:
            out[kwarg] = int(value)
    if framework == "onnxruntime":
        out["execution_mode"] = "par" if parameters.get(names["mode"], "0") == "1" else "seq"
        levels = {code: name for name, code in TRITON_GRAPH_LEVEL.items()}
        out["graph_optimization_level"] = levels.get(int(graph_level or 0), "all")
    return out


def variant_of(framework: str, parameters: Mapping[str, str], precision: str = "fp32") -> Variant:
    """The variant an entry's config declares (its ``variant`` parameter; the default variant of ``framework`` in
    ``precision`` for entries exported before variants existed)."""
    text = parameters.get(VARIANT_PARAMETER, "")
    return Variant.parse(text, "parameters.variant") if text else Variant(framework, precision=precision)
