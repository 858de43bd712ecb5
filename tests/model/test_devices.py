"""Where the embedded engine runs: the devices ggml reports, and the offload default."""

from __future__ import annotations

import pytest

from oars.engines.devices import describe, devices, gpu_layers

pytestmark = pytest.mark.model


def test_the_build_lists_its_devices_and_offloads_only_to_a_gpu() -> None:
    import llama_cpp

    listed = devices()
    assert any(d.name == "CPU" and d.kind == "CPU" for d in listed)
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    assert gpu_layers(None) == (-1 if gpu else 0)
    assert gpu_layers(7) == 7
    line = describe(gpu_layers(None))
    assert line.startswith("devices CPU (")
    assert line.endswith("all layers offloaded" if gpu else "running on the CPU")
