"""Model repositories the tests serve, written by hand."""

from __future__ import annotations


def write_sleep_chain(repo, name, members, max_batch_size=32):
    """An ensemble ``name`` over sleep entries (input -> output, 4 floats), each member reading the previous one's
    output: a chain (``max_batch_size``: at most the members')."""
    from tritonclient.grpc import model_config_pb2 as mc

    from serving_bench.export.repository import ModelConfig, write_config

    config = ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    config.input.add(name="input", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="output", data_type=mc.TYPE_FP32, dims=[4])
    for i, member in enumerate(members):
        step = config.ensemble_scheduling.step.add(model_name=member, model_version=-1)
        step.input_map["input"] = "input" if i == 0 else f"between_{i}"
        step.output_map["output"] = "output" if i == len(members) - 1 else f"between_{i + 1}"
    (repo / name / "1").mkdir(parents=True)
    write_config(config, repo / name / "config.pbtxt")
